//! The `courier-pipeline` binary: parses the command line, then hands over to the library.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use courier_pipeline::{app, telemetry, FileConfig, Overrides, Role, RunOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "courier-pipeline", version, about = "Live courier locations: MQTT in, Redis GEO and order tracks out")]
struct Cli {
    /// TOML configuration file (see README, "Configuration").
    #[arg(long, global = true, env = "COURIER_CONFIG")]
    config: Option<PathBuf>,
    /// External broker, e.g. mqtt://127.0.0.1:1883. Unset: `run` embeds rumqttd.
    #[arg(long, global = true, env = "MQTT_URL")]
    mqtt_url: Option<String>,
    /// TCP address of the embedded broker.
    #[arg(long, global = true, env = "MQTT_LISTEN")]
    mqtt_listen: Option<String>,
    #[arg(long, global = true, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Prometheus /metrics address, or `off`.
    #[arg(long, global = true, env = "METRICS_LISTEN")]
    metrics_listen: Option<String>,
    #[arg(long, global = true, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// HTTP APIs address.
    #[arg(long, global = true, env = "HTTP_LISTEN")]
    http_listen: Option<String>,
    /// Viewer gateway (MQTT over WebSocket) address.
    #[arg(long, global = true, env = "WS_LISTEN")]
    ws_listen: Option<String>,
    /// Token signing keys, kid:secret[,kid:secret...]; the first signs.
    #[arg(long, global = true, env = "AUTH_KEYS", hide_env_values = true)]
    auth_keys: Option<String>,
    /// Bearer key of the orders API (the order service presents it).
    #[arg(long, global = true, env = "SERVICE_KEY", hide_env_values = true)]
    service_key: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every role in one process, with the embedded broker unless MQTT_URL is set.
    Run(RunArgs),
    /// The ingest role alone, against the broker at MQTT_URL (or MQTT_LISTEN's address).
    Ingest(RunArgs),
    /// The embedded broker alone.
    Broker(RunArgs),
    /// Orders API (HTTP_LISTEN) and viewer gateway (WS_LISTEN), against the broker at MQTT_URL.
    Fanout(RunArgs),
    /// Load: couriers moving in a box, publishing points to the broker.
    Simulate(SimArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Print a status line this often, e.g. `1s`.
    #[arg(long, value_parser = humantime::parse_duration)]
    status_every: Option<Duration>,
}

#[derive(Args)]
struct SimArgs {
    #[arg(long, default_value_t = 1000)]
    couriers: usize,
    /// Seconds between two points of one courier.
    #[arg(long, default_value_t = 4.0)]
    interval: f64,
    /// MQTT connections the couriers share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(long)]
    seconds: Option<f64>,
    /// Courier ids are <prefix><number>.
    #[arg(long, default_value = "c")]
    id_prefix: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init_logs();
    let file = match &cli.config {
        Some(p) => FileConfig::from_file(p)?,
        None => FileConfig::default(),
    };
    let config = file.resolve(Overrides {
        mqtt_url: cli.mqtt_url.clone(),
        mqtt_listen: cli.mqtt_listen.clone(),
        redis_url: cli.redis_url.clone(),
        metrics_listen: cli.metrics_listen.clone(),
        database_url: cli.database_url.clone(),
        http_listen: cli.http_listen.clone(),
        ws_listen: cli.ws_listen.clone(),
        auth_keys: cli.auth_keys.clone(),
        service_key: cli.service_key.clone(),
    })?;
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        tokio::spawn(signals(shutdown.clone()));
        let grace = config.shutdown_grace;
        let (role, opts) = match cli.command {
            Command::Run(a) => (Role::All, a),
            Command::Ingest(a) => (Role::Ingest, a),
            Command::Broker(a) => (Role::Broker, a),
            Command::Fanout(a) => (Role::Fanout, a),
            Command::Simulate(a) => return simulate(a, config.broker.endpoint(), shutdown).await,
        };
        let opts = RunOptions { status_every: opts.status_every };
        let task = tokio::spawn(app::run(config, role, opts, shutdown.clone()));
        tokio::pin!(task);
        tokio::select! {
            r = &mut task => return Ok(r.context("pipeline task panicked")??),
            _ = shutdown.cancelled() => {}
        }
        tracing::info!(grace = ?grace, "shutting down: intake stopped, draining");
        match tokio::time::timeout(grace, task).await {
            Ok(r) => {
                r.context("pipeline task panicked")??;
                tracing::info!("stopped cleanly");
                Ok(())
            }
            Err(_) => anyhow::bail!("shutdown took longer than {grace:?}; exiting with work undone"),
        }
    })
}

async fn simulate(a: SimArgs, endpoint: courier_wire::MqttEndpoint, shutdown: CancellationToken) -> anyhow::Result<()> {
    anyhow::ensure!(a.interval > 0.0, "--interval must be above 0");
    let cfg = simulator::SimConfig {
        couriers: a.couriers,
        interval: Duration::from_secs_f64(a.interval),
        connections: a.connections,
        duration: a.seconds.map(Duration::from_secs_f64),
        id_prefix: a.id_prefix,
        ..Default::default()
    };
    let stats = Arc::new(simulator::SimStats::default());
    let progress = {
        let (stats, stop) = (stats.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last = 0;
            loop {
                tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
                let sent = stats.sent.load(std::sync::atomic::Ordering::Relaxed);
                eprintln!("sim: sent {:>7}/s, total {sent}", sent - last);
                last = sent;
            }
        })
    };
    let report = simulator::run(cfg.clone(), endpoint, stats, shutdown).await?;
    progress.abort();
    println!("{}", report.line(&cfg));
    Ok(())
}

/// Ctrl-C or SIGTERM starts a graceful shutdown; a second one exits at once.
async fn signals(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    for n in 0.. {
        let term_recv = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term_recv => {}
        }
        if n > 0 {
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        }
        shutdown.cancel();
    }
}
