//! The `courier-pipeline` binary: parses the command line, then hands over to the library.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
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
    /// TLS listener of the embedded broker (needs mqtt.tls_cert and mqtt.tls_key).
    #[arg(long, global = true, env = "MQTT_TLS_LISTEN")]
    mqtt_tls_listen: Option<String>,
    /// PEM certificates to trust for an mqtts:// MQTT_URL.
    #[arg(long, global = true, env = "MQTT_CA_FILE")]
    mqtt_ca_file: Option<String>,
    /// Let the embedded broker admit clients without credentials (development only).
    #[arg(long, global = true, env = "MQTT_ALLOW_ANONYMOUS")]
    mqtt_allow_anonymous: Option<bool>,
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
    /// The history writer (MQTT -> PostgreSQL) and the trail API on HTTP_LISTEN.
    #[command(name = "history-writer")]
    HistoryWriter(RunArgs),
    /// Applies the missing PostgreSQL migrations (sql/) to DATABASE_URL.
    Migrate,
    /// Mints a signed token with AUTH_KEYS.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Orders API (HTTP_LISTEN) and viewer gateway (WS_LISTEN), against the broker at MQTT_URL.
    Fanout(RunArgs),
    /// Load: couriers moving in a box, publishing points to the broker.
    Simulate(SimArgs),
    /// Exit 0 when an HTTP endpoint (e.g. http://127.0.0.1:9464/readyz) answers 200: for
    /// container health checks, with no curl in the image.
    Health {
        /// http://host:port/path
        url: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// A support token with the `trail:read` scope, printed on stdout.
    Support {
        /// Who will use it; recorded in trail_access_log.
        #[arg(long)]
        actor: String,
        /// How long it is valid, e.g. `1h`, `30m`.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A courier's device token (MQTT password; username = the courier id), signed with the
    /// first key of AUTH_KEYS. Rotation: put a new key first, re-issue, then drop the old key.
    Courier {
        /// The courier id, e.g. c00042.
        #[arg(long)]
        id: String,
        /// How long it is valid.
        #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A worker's broker credential (service scope), for a worker on another host.
    Service {
        /// The role it is for, e.g. ingest.
        #[arg(long)]
        role: String,
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
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
        metrics_listen: cli.metrics_listen.clone(),
        database_url: cli.database_url.clone(),
        http_listen: cli.http_listen.clone(),
        ws_listen: cli.ws_listen.clone(),
        auth_keys: cli.auth_keys.clone(),
        mqtt_tls_listen: cli.mqtt_tls_listen.clone(),
        mqtt_ca_file: cli.mqtt_ca_file.clone(),
        mqtt_allow_anonymous: cli.mqtt_allow_anonymous,
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
            Command::HistoryWriter(a) => (Role::History, a),
            Command::Fanout(a) => (Role::Fanout, a),
            Command::Migrate => return migrate(&config.database_url).await,
            Command::Token(TokenCommand::Support { actor, ttl }) => {
                return support_token(config.auth.as_ref(), &actor, ttl)
            }
            Command::Token(TokenCommand::Courier { id, ttl }) => {
                anyhow::ensure!(
                    courier_wire::topic::valid_id(&id),
                    "--id: not a valid courier id"
                );
                return mint(config.auth.as_ref(), |now| {
                    courier_auth::Claims::courier(&id, now, ttl.as_secs())
                });
            }
            Command::Token(TokenCommand::Service { role, ttl }) => {
                anyhow::ensure!(
                    courier_wire::topic::valid_id(&role),
                    "--role: letters, digits, - and _ only"
                );
                return mint(config.auth.as_ref(), |now| {
                    courier_auth::Claims::service(&role, now, ttl.as_secs())
                });
            }
            Command::Health { .. } => unreachable!("handled before the runtime starts"),
            Command::Simulate(a) => {
                return simulate(a, config.worker_endpoint("simulator"), shutdown).await
            }
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
    endpoint: courier_wire::MqttEndpoint,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
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

fn health(url: &str) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let rest = url
        .strip_prefix("http://")
        .context("health: expected an http:// URL")?;
    let (hostport, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .context("health: bad address")?
        .next()
        .context("health: address resolves to nothing")?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .context("health: connect")?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n")?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).context("health: no answer")?;
    anyhow::ensure!(
        &head[9..12] == b"200",
        "health: {url} answered {}",
        String::from_utf8_lossy(&head[9..12])
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

fn support_token(
    keys: Option<&courier_auth::Keyring>,
    actor: &str,
    ttl: Duration,
) -> anyhow::Result<()> {
    let keys = keys.context("AUTH_KEYS is not set: tokens are signed with it (kid:secret, a secret of at least 16 bytes)")?;
    anyhow::ensure!(
        !actor.trim().is_empty() && actor.len() <= 128 && !actor.chars().any(char::is_control),
        "--actor must be a name of 1-128 printable characters"
    );
    anyhow::ensure!(ttl >= Duration::from_secs(1), "--ttl must be at least 1s");
    let now = courier_wire::clock::unix_now() as u64;
    let claims = courier_auth::Claims {
        sub: actor.trim().to_string(),
        scope: history_writer::TRAIL_SCOPE.to_string(),
        order: None,
        iat: now,
        exp: now + ttl.as_secs(),
    };
    println!("{}", keys.sign(&claims));
    Ok(())
}

/// Prints a token signed with the first key of AUTH_KEYS.
fn mint(
    keys: Option<&courier_auth::Keyring>,
    claims: impl FnOnce(u64) -> courier_auth::Claims,
) -> anyhow::Result<()> {
    let keys = keys.context("AUTH_KEYS is not set: tokens are signed with it (kid:secret, a secret of at least 16 bytes)")?;
    let now = courier_wire::clock::unix_now() as u64;
    println!("{}", keys.sign(&claims(now)));
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
