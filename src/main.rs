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
    /// Load: couriers moving in a box, publishing points to the broker.
    Simulate(SimArgs),
    /// Dispatch query: the nearest couriers seen recently, searched in expanding rings.
    Nearest(NearestArgs),
}

#[derive(Args)]
struct NearestArgs {
    #[arg(long, allow_hyphen_values = true)]
    lat: f64,
    #[arg(long, allow_hyphen_values = true)]
    lon: f64,
    #[arg(long, default_value_t = 10)]
    count: usize,
    /// Ring radii in km, ascending.
    #[arg(long, default_value = "0.5,1,2,5")]
    radii: String,
    /// Skip couriers whose last point is older.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    max_age: Duration,
    /// Any `count` couriers of the first ring that holds enough, not the nearest (hot spots).
    #[arg(long)]
    any: bool,
    /// Run this many searches (32 in flight) and print searches/s and p99 instead.
    #[arg(long)]
    bench: Option<usize>,
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
    /// Fixed profile: seconds between two points of one courier (default 4 unless --mix).
    #[arg(long, conflicts_with = "mix")]
    interval: Option<f64>,
    /// Realistic mix instead of a fixed interval; fractions such as
    /// `to_restaurant=0.25,to_customer=0.25,available=0.35,off_shift=0.15` (`default` for these).
    #[arg(long)]
    mix: Option<String>,
    /// Mix: a check sends only after moving this many metres...
    #[arg(long, default_value_t = 20.0)]
    min_move: f64,
    /// ...or when the last point is this many seconds old (standing couriers).
    #[arg(long, default_value_t = 30.0)]
    heartbeat: f64,
    /// Share K MQTT connections among the couriers (default: one per courier, as phones do).
    #[arg(long)]
    connections: Option<usize>,
    /// Connection attempts in flight at once while couriers come online.
    #[arg(long, default_value_t = 256)]
    connect_concurrency: usize,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(long)]
    seconds: Option<f64>,
    /// Courier ids are <prefix><number>.
    #[arg(long, default_value = "c")]
    id_prefix: String,
    /// Assign K orders (in `courier:order`) and watch each on `track/<order>`, measuring the
    /// phone-to-viewer delay.
    #[arg(long, default_value_t = 0)]
    orders: usize,
    /// More addresses of the same broker; courier connections are spread over MQTT_URL and
    /// these (one source address has about 28,000 ports per destination).
    #[arg(long = "also-mqtt-url")]
    also_mqtt_url: Vec<String>,
    /// Write every figure of the run to this file as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Fault: share of couriers that lose the network once, then flush their buffered points.
    #[arg(long, default_value_t = 0.0)]
    outage: f64,
    /// Seconds an outage lasts.
    #[arg(long, default_value_t = 20.0)]
    outage_for: f64,
    /// Fault: share of points sent as exactly (0, 0).
    #[arg(long, default_value_t = 0.0)]
    null_island: f64,
    /// Fault: share of couriers stuck at one shared default location (--default-at).
    #[arg(long, default_value_t = 0.0)]
    default_location: f64,
    /// The default location, `lat,lon`.
    #[arg(long, default_value = "24.7114,46.6744")]
    default_at: String,
    /// Fault: share of couriers whose app restarts once (seq starts again at 1).
    #[arg(long, default_value_t = 0.0)]
    restart: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
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
    })?;
    if matches!(cli.command, Command::Run(_) | Command::Broker(_)) {
        // The embedded broker holds one descriptor per connected phone.
        simulator::limits::raise_nofile(1 << 17);
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        tokio::spawn(signals(shutdown.clone()));
        let grace = config.shutdown_grace;
        let (role, opts) = match cli.command {
            Command::Run(a) => (Role::All, a),
            Command::Ingest(a) => (Role::Ingest, a),
            Command::Broker(a) => (Role::Broker, a),
            Command::Simulate(a) => return simulate(a, config, shutdown).await,
            Command::Nearest(a) => return nearest(a, config).await,
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

async fn simulate(
    a: SimArgs,
    config: courier_pipeline::Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let profile = match (&a.mix, a.interval) {
        (Some(m), _) => {
            let base = simulator::Mix {
                min_move_m: a.min_move,
                heartbeat: a.heartbeat,
                ..Default::default()
            };
            let text = if m == "default" { "" } else { m.as_str() };
            simulator::Profile::Mix(base.parse_fractions(text).map_err(anyhow::Error::msg)?)
        }
        (None, i) => {
            let i = i.unwrap_or(4.0);
            anyhow::ensure!(i > 0.0 && i.is_finite(), "--interval must be above 0");
            simulator::Profile::Fixed {
                interval: Duration::from_secs_f64(i),
            }
        }
    };
    let default_at = a
        .default_at
        .split_once(',')
        .and_then(|(la, lo)| Some((la.trim().parse().ok()?, lo.trim().parse().ok()?)))
        .context("--default-at: expected lat,lon")?;
    anyhow::ensure!(
        a.outage_for >= 0.0 && a.outage_for.is_finite(),
        "--outage-for must be >= 0"
    );
    let cfg = simulator::SimConfig {
        couriers: a.couriers,
        profile,
        connections: a.connections,
        connect_concurrency: a.connect_concurrency,
        duration: a.seconds.map(Duration::from_secs_f64),
        id_prefix: a.id_prefix,
        seed: a.seed,
        faults: simulator::Faults {
            outage: a.outage,
            outage_for: Duration::from_secs_f64(a.outage_for),
            null_island: a.null_island,
            default_location: a.default_location,
            default_at,
            restart: a.restart,
            ..Default::default()
        },
        watchers: simulator::Watchers { orders: a.orders },
        ..Default::default()
    };
    cfg.validate().map_err(anyhow::Error::msg)?;
    let endpoint = config.broker.endpoint();
    let also = a
        .also_mqtt_url
        .iter()
        .map(|u| {
            courier_wire::MqttEndpoint::parse(u).with_context(|| format!("--also-mqtt-url {u:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sim = simulator::Simulator {
        config: cfg,
        mqtt: endpoint.clone(),
        also,
        assigner: simulator::watchers::Assigner::Redis {
            url: config.redis_url.clone(),
            keys: config.keys.clone(),
        },
        viewer: simulator::watchers::Viewer::Broker { endpoint },
        stats: Arc::new(simulator::SimStats::default()),
    };
    let report = sim.run(shutdown, |s| eprintln!("{}", s.line())).await?;
    println!("{}", report.line());
    if let Some(path) = a.report {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn nearest(a: NearestArgs, config: courier_pipeline::Config) -> anyhow::Result<()> {
    let q = dispatch::Query {
        lat: a.lat,
        lon: a.lon,
        count: a.count,
        radii_km: dispatch::query::parse_radii(&a.radii).map_err(anyhow::Error::msg)?,
        max_age: a.max_age,
        any: a.any,
    };
    q.validate()?;
    let d = dispatch::Dispatch::connect(&config.redis_url, config.keys.clone()).await?;
    if let Some(n) = a.bench {
        let r = dispatch::bench::searches(&d, vec![q], n, 32).await?;
        println!("{}", r.line("nearest"));
        return Ok(());
    }
    let now = courier_wire::clock::unix_now();
    let found = d.nearest(&q, now).await?;
    match found.ring {
        Some(r) => println!(
            "{} nearest within {} km (ring {} of {}), seen in the last {}:",
            found.couriers.len(),
            q.radii_km[r],
            r + 1,
            q.radii_km.len(),
            humantime::format_duration(q.max_age)
        ),
        None => println!(
            "only {} within {} km (the widest ring), seen in the last {}:",
            found.couriers.len(),
            q.radii_km.last().copied().unwrap_or_default(),
            humantime::format_duration(q.max_age)
        ),
    }
    for c in &found.couriers {
        println!(
            "  {}  {:.3} km  last seen {:.1}s ago",
            c.id,
            c.dist_km,
            (now - c.seen).max(0.0)
        );
    }
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
