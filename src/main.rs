//! The `courier-pipeline` binary: parses the command line, then hands over to the library.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use courier_auth::Audience;
use courier_pipeline::{app, telemetry, FileConfig, Overrides, Role, RunOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "courier-pipeline",
    version,
    about = "Live courier locations: MQTT in, Redis GEO and order tracks out"
)]
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
    /// Redis Cluster seed nodes, comma-separated (then REDIS_URL is not used).
    #[arg(long, global = true, env = "REDIS_CLUSTER_NODES")]
    redis_cluster_nodes: Option<String>,
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
    /// Key directory: <aud>.key signs, <aud>.pub / .json verify (courier, viewer, trail, bus).
    #[arg(long, global = true, env = "AUTH_KEY_DIR")]
    key_dir: Option<String>,
    /// A bus token to log in with instead of minting one with bus.key (e.g. for the edge).
    #[arg(long, global = true, env = "MQTT_TOKEN", hide_env_values = true)]
    mqtt_token: Option<String>,
    /// TLS listener of the embedded broker (needs mqtt.tls_cert and mqtt.tls_key).
    #[arg(long, global = true, env = "MQTT_TLS_LISTEN")]
    mqtt_tls_listen: Option<String>,
    /// PEM certificates to trust for an mqtts:// MQTT_URL.
    #[arg(long, global = true, env = "MQTT_CA_FILE")]
    mqtt_ca_file: Option<String>,
    /// Let the embedded broker admit clients without credentials (development only).
    #[arg(long, global = true, env = "MQTT_ALLOW_ANONYMOUS")]
    mqtt_allow_anonymous: Option<bool>,
    /// The MQTT edge phones connect to: address(es), comma-separated, or `off`.
    #[arg(long, global = true, env = "EDGE_LISTEN")]
    edge_listen: Option<String>,
    /// MQTT over TLS listener(s) of the edge (needs EDGE_TLS_CERT and EDGE_TLS_KEY).
    #[arg(long, global = true, env = "EDGE_TLS_LISTEN")]
    edge_tls_listen: Option<String>,
    /// PEM certificate chain of the edge's TLS listener.
    #[arg(long, global = true, env = "EDGE_TLS_CERT")]
    edge_tls_cert: Option<String>,
    /// PEM private key of the edge's TLS listener.
    #[arg(long, global = true, env = "EDGE_TLS_KEY")]
    edge_tls_key: Option<String>,
    /// MQTT over WebSocket listener(s) of the edge (path /mqtt).
    #[arg(long, global = true, env = "EDGE_WS_LISTEN")]
    edge_ws_listen: Option<String>,
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
    /// The embedded bus broker alone (service logins only).
    Broker(RunArgs),
    /// The MQTT edge alone: phones log in here; it forwards to the bus at MQTT_URL. Several
    /// edge processes may share one port (SO_REUSEPORT).
    Edge(RunArgs),
    /// The history writer (MQTT -> PostgreSQL) and the trail API on HTTP_LISTEN.
    #[command(name = "history-writer")]
    HistoryWriter(RunArgs),
    /// Applies the missing PostgreSQL migrations (sql/) to DATABASE_URL.
    Migrate,
    /// Mints a token with the audience's private key (AUTH_KEY_DIR/<aud>.key).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Orders API (HTTP_LISTEN) and viewer gateway (WS_LISTEN), against the broker at MQTT_URL.
    Fanout(RunArgs),
    /// Order events: relays them into the PostgreSQL outbox and delivers them as signed
    /// webhooks; the webhooks API on HTTP_LISTEN (docs/events.md). Several may run at once.
    Notify(RunArgs),
    /// Load: couriers moving in a box, publishing points to the broker.
    Simulate(SimArgs),
    /// Exit 0 when an HTTP endpoint (e.g. http://127.0.0.1:9464/readyz) answers 200: for
    /// container health checks, with no curl in the image.
    Health {
        /// http://host:port/path
        url: String,
    },
    /// Dispatch query: the nearest couriers seen recently, searched in expanding rings.
    Nearest(NearestArgs),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// A support actor's trail token (audience `trail`, signed with trail.key), on stdout.
    #[command(alias = "support")]
    Trail {
        /// Who will use it; recorded in trail_access_log.
        #[arg(long)]
        actor: String,
        /// How long it is valid, e.g. `1h`, `30m`.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A data-protection officer's erasure token (audience `privacy`, signed with
    /// privacy.key), on stdout: `POST /couriers/{id}/erasure` (docs/privacy.md).
    Privacy {
        /// Who will use it; recorded in erasure_log.
        #[arg(long)]
        actor: String,
        /// How long it is valid, e.g. `15m`.
        #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// An operations user's token for the live map `/ops` (audience `ops`, signed with
    /// ops.key), on stdout; the trail API admits it too (docs/maps.md).
    Ops {
        /// Who will use it; recorded in trail_access_log as `ops:<user>`.
        #[arg(long, alias = "actor")]
        user: String,
        /// How long it is valid, e.g. `8h` (a shift).
        #[arg(long, default_value = "8h", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A courier's device token (MQTT password at the edge; username = the courier id), signed
    /// with courier.key. Rotation: docs/security.md.
    Courier {
        /// The courier id, e.g. c00042.
        #[arg(long)]
        id: String,
        /// How long it is valid.
        #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A worker's bus token (audience `bus`, signed with bus.key; username = the role), for a
    /// process given MQTT_TOKEN instead of bus.key, such as the edge.
    #[command(alias = "service")]
    Bus {
        /// The role it is for, e.g. ingest.
        #[arg(long)]
        role: String,
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
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
    /// Assign K orders and watch each like a customer, measuring the phone-to-viewer delay:
    /// through the orders API and the viewer gateway with --orders-api, else straight in
    /// `courier:order` and `track/<order>` on the broker.
    #[arg(long, default_value_t = 0)]
    orders: usize,
    /// The orders API, e.g. http://127.0.0.1:8080 (needs SERVICE_KEY): orders are assigned
    /// and delivered there, and watched through the gateway URL of their tracking tokens.
    #[arg(long)]
    orders_api: Option<String>,
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

/// Errors end the process with one line (`error: <setting>: <reason>`), never a backtrace.
fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Health { url } = &cli.command {
        return health(url);
    }
    telemetry::init_logs(telemetry::LogFormat::from_env().map_err(anyhow::Error::msg)?);
    let file = match &cli.config {
        Some(p) => FileConfig::from_file(p)?,
        None => FileConfig::default(),
    };
    let config = file.resolve(Overrides {
        mqtt_url: cli.mqtt_url.clone(),
        mqtt_listen: cli.mqtt_listen.clone(),
        redis_url: cli.redis_url.clone(),
        redis_cluster_nodes: cli.redis_cluster_nodes.clone(),
        metrics_listen: cli.metrics_listen.clone(),
        database_url: cli.database_url.clone(),
        http_listen: cli.http_listen.clone(),
        ws_listen: cli.ws_listen.clone(),
        key_dir: cli.key_dir.clone(),
        mint: mints(&cli.command),
        mqtt_token: cli.mqtt_token.clone(),
        mqtt_tls_listen: cli.mqtt_tls_listen.clone(),
        mqtt_ca_file: cli.mqtt_ca_file.clone(),
        mqtt_allow_anonymous: cli.mqtt_allow_anonymous,
        service_key: cli.service_key.clone(),
        edge_listen: cli.edge_listen.clone(),
        edge_tls_listen: cli.edge_tls_listen.clone(),
        edge_tls_cert: cli.edge_tls_cert.clone(),
        edge_tls_key: cli.edge_tls_key.clone(),
        edge_ws_listen: cli.edge_ws_listen.clone(),
    })?;

    // A separate edge process runs on `edge.threads` (1 by default): its work is waking sessions
    // for their sockets, and one thread spares the cross-thread wake-ups (futex) of a
    // multi-thread scheduler. More cores: more edge processes on the same port (SO_REUSEPORT).
    let runtime = match (&cli.command, config.edge.threads) {
        (Command::Edge(_), 1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        (Command::Edge(_), n) if n > 1 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        _ => tokio::runtime::Runtime::new(),
    }
    .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        tokio::spawn(signals(shutdown.clone()));
        let grace = config.shutdown_grace;
        let (role, opts) = match cli.command {
            Command::Run(a) => (Role::All, a),
            Command::Ingest(a) => (Role::Ingest, a),
            Command::Broker(a) => (Role::Broker, a),
            Command::Edge(a) => (Role::Edge, a),
            Command::HistoryWriter(a) => (Role::History, a),
            Command::Fanout(a) => (Role::Fanout, a),
            Command::Notify(a) => (Role::Notify, a),
            Command::Migrate => return migrate(&config.database_url).await,
            Command::Token(TokenCommand::Trail { actor, ttl }) => {
                check_actor(&actor)?;
                return mint(&config, Audience::Trail, |now| {
                    courier_auth::Claims::trail(actor.trim(), now, ttl.as_secs())
                });
            }
            Command::Token(TokenCommand::Privacy { actor, ttl }) => {
                check_actor(&actor)?;
                return mint(&config, Audience::Privacy, |now| {
                    courier_auth::Claims::privacy(actor.trim(), now, ttl.as_secs())
                });
            }
            Command::Token(TokenCommand::Ops { user, ttl }) => {
                check_actor(&user)?;
                return mint(&config, Audience::Ops, |now| {
                    courier_auth::Claims::ops(user.trim(), now, ttl.as_secs())
                });
            }
            Command::Token(TokenCommand::Courier { id, ttl }) => {
                anyhow::ensure!(
                    courier_wire::topic::valid_id(&id),
                    "--id: not a valid courier id"
                );
                return mint(&config, Audience::Courier, |now| {
                    courier_auth::Claims::courier(&id, now, ttl.as_secs())
                });
            }
            Command::Token(TokenCommand::Bus { role, ttl }) => {
                anyhow::ensure!(
                    courier_wire::topic::valid_id(&role),
                    "--role: letters, digits, - and _ only"
                );
                return mint(&config, Audience::Bus, |now| {
                    courier_auth::Claims::bus(&role, now, ttl.as_secs())
                });
            }
            Command::Health { .. } => unreachable!("handled before the runtime starts"),
            Command::Simulate(a) => return simulate(a, config, shutdown).await,
            Command::Nearest(a) => return nearest(a, config).await,
        };
        let opts = RunOptions {
            status_every: opts.status_every,
        };
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
            Err(_) => {
                anyhow::bail!("shutdown took longer than {grace:?}; exiting with work undone")
            }
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
    let d = dispatch::Dispatch::connect(&config.redis, config.keys.clone()).await?;
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

/// `GET url` answered 200 within 2 s (the container's health check: no curl in the image).
fn health(url: &str) -> anyhow::Result<()> {
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(
            courier_wire::http_client::HttpClient::new(Duration::from_secs(2), 64 * 1024)
                .get(url, &[]),
        )
        .context("health")?;
    anyhow::ensure!(
        answer.status == 200,
        "health: {url} answered {}",
        answer.status
    );
    Ok(())
}

async fn migrate(url: &str) -> anyhow::Result<()> {
    let mut client = history_writer::sink::connect(url, "courier-pipeline-migrate")
        .await
        .context("connecting to DATABASE_URL")?;
    let applied = history_writer::migrate(&mut client).await?;
    if applied.is_empty() {
        println!("migrations: up to date");
    } else {
        println!("migrations: applied {applied:?}");
    }
    Ok(())
}

/// An actor named in an audit row: printable, 1-128 characters.
fn check_actor(actor: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !actor.trim().is_empty() && actor.len() <= 128 && !actor.chars().any(char::is_control),
        "--actor must be a name of 1-128 printable characters"
    );
    Ok(())
}

/// The audiences whose private keys a command reads: what it mints, nothing more (the edge
/// and the bus broker read none).
fn mints(command: &Command) -> Vec<Audience> {
    match command {
        Command::Run(_) | Command::Fanout(_) => vec![Audience::Viewer, Audience::Bus],
        Command::Ingest(_) | Command::HistoryWriter(_) => vec![Audience::Bus],
        // Its own connection per courier logs in at the edge with a device token; shared
        // connections, and watchers on the broker (orders without --orders-api), at the bus.
        Command::Simulate(a) => {
            let mut v = Vec::new();
            if a.connections.is_none() {
                v.push(Audience::Courier);
            }
            if a.connections.is_some() || (a.orders > 0 && a.orders_api.is_none()) {
                v.push(Audience::Bus);
            }
            v
        }
        Command::Token(TokenCommand::Courier { .. }) => vec![Audience::Courier],
        Command::Token(TokenCommand::Trail { .. }) => vec![Audience::Trail],
        Command::Token(TokenCommand::Privacy { .. }) => vec![Audience::Privacy],
        Command::Token(TokenCommand::Ops { .. }) => vec![Audience::Ops],
        Command::Token(TokenCommand::Bus { .. }) => vec![Audience::Bus],
        Command::Broker(_)
        | Command::Notify(_)
        | Command::Edge(_)
        | Command::Migrate
        | Command::Health { .. }
        | Command::Nearest(_) => vec![],
    }
}

/// Prints a token signed with the audience's private key.
fn mint(
    config: &courier_pipeline::Config,
    aud: Audience,
    claims: impl FnOnce(u64) -> courier_auth::Claims,
) -> anyhow::Result<()> {
    let key = config.signer(aud, &format!("{aud} tokens are signed with it"))?;
    let now = courier_wire::clock::unix_now() as u64;
    println!("{}", key.sign(&claims(now)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mints_of(args: &str) -> Vec<Audience> {
        let cli = Cli::try_parse_from(args.split(' ')).unwrap();
        mints(&cli.command)
    }

    /// Each command reads the private keys of what it mints and no others: the edge and the
    /// bus none; a per-courier simulator the courier key, and the bus key only when it also
    /// watches orders on the bus (the demo's watchers were refused when it did not).
    #[test]
    fn each_command_reads_only_the_keys_it_mints_with() {
        use Audience::*;
        assert_eq!(mints_of("cp edge"), []);
        assert_eq!(mints_of("cp broker"), []);
        assert_eq!(mints_of("cp run"), [Viewer, Bus]);
        assert_eq!(mints_of("cp ingest"), [Bus]);
        assert_eq!(mints_of("cp token trail --actor a"), [Trail]);
        assert_eq!(mints_of("cp token privacy --actor a"), [Privacy]);
        assert_eq!(mints_of("cp token ops --user a"), [Ops]);
        assert_eq!(mints_of("cp simulate --couriers 5"), [Courier]);
        assert_eq!(
            mints_of("cp simulate --couriers 5 --orders 2"),
            [Courier, Bus]
        );
        assert_eq!(
            mints_of("cp simulate --couriers 5 --orders 2 --orders-api http://x"),
            [Courier]
        );
        assert_eq!(mints_of("cp simulate --couriers 5 --connections 2"), [Bus]);
    }
}
