//! `courier-pipeline simulate`: the simulator's own flags (`simulator::cli`) plus where its
//! connections go and how they log in, from the pipeline's settings.

use anyhow::Context;
use courier_auth::Audience;
use simulator::cli::SimArgs;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs the simulator until its `--seconds` or `shutdown`, then prints its report.
pub(crate) async fn run(
    a: SimArgs,
    config: courier_pipeline::Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let cfg = simulator::SimConfig::try_from(&a)?;
    // Multiplexed connections go to the bus and log in as the load tester (a bus token); a
    // courier's own connection goes to the edge (EDGE_LISTEN) and logs in as that courier with his
    // device token, as a phone does.
    let mut endpoint = config.worker_endpoint("simulator");
    let bus = endpoint.clone();
    if a.connections.is_none() {
        let edge = config
            .edge
            .tcp
            .first()
            .context("one connection per courier goes to the edge: set EDGE_LISTEN")?;
        endpoint = courier_wire::MqttEndpoint::new(edge.ip().to_string(), edge.port());
    }
    let courier_login: Option<simulator::links::CourierLogin> = config
        .auth
        .as_ref()
        .and_then(|k| k.signer(Audience::Courier))
        .cloned()
        .map(|keys| {
            let f: simulator::links::CourierLogin = Arc::new(move |id: &str| {
                let now = courier_wire::clock::unix_now() as u64;
                keys.sign(&courier_auth::Claims::courier(id, now, 24 * 3600))
            });
            f
        });
    let also = a
        .also_mqtt_url
        .iter()
        .map(|u| {
            courier_wire::MqttEndpoint::parse(u).with_context(|| format!("--also-mqtt-url {u:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    use simulator::watchers::{Assigner, Viewer};
    let (assigner, viewer) = match a.orders_api {
        Some(base_url) => {
            let service_key = config
                .fanout
                .service_key
                .clone()
                .context("--orders-api needs the service key (SERVICE_KEY or --service-key)")?;
            (
                Assigner::Api {
                    base_url,
                    service_key,
                },
                Viewer::Gateway,
            )
        }
        None => (
            Assigner::Redis {
                redis: config.redis.clone(),
                keys: Box::new(config.keys.clone()),
            },
            Viewer::Broker { endpoint: bus },
        ),
    };
    assigner.check(&viewer).context("--orders-api")?;
    let sim = simulator::Simulator {
        config: cfg,
        mqtt: endpoint,
        also,
        assigner,
        viewer,
        stats: Arc::new(simulator::SimStats::default()),
        courier_login,
    };
    let report = sim.run(shutdown, |s| eprintln!("{}", s.line())).await?;
    println!("{}", report.line());
    if let Some(path) = a.report {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
