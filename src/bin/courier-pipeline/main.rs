//! The `courier-pipeline` binary: parses the command line, loads the settings once, and hands
//! over to the library (`app::run` for the roles) or to one module per other command:
//! `token` (mint a token), `simulate` (load), `nearest` (a dispatch query), `health`.

mod health;
mod nearest;
mod simulate;
mod token;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use courier_auth::Audience;
use courier_pipeline::{app, telemetry, FileConfig, Overrides, Role, RunOptions};
use std::path::PathBuf;
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
    /// The settings given by flag or environment, over the file's.
    #[command(flatten)]
    settings: Overrides,
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
    Token(token::TokenCommand),
    /// Orders API (HTTP_LISTEN) and viewer gateway (WS_LISTEN), against the broker at MQTT_URL.
    Fanout(RunArgs),
    /// Order events: relays them into the PostgreSQL outbox and delivers them as signed
    /// webhooks; the webhooks API on HTTP_LISTEN (docs/events.md). Several may run at once.
    Notify(RunArgs),
    /// Load: couriers moving in a box, publishing points to the broker.
    Simulate(simulator::cli::SimArgs),
    /// Exit 0 when an HTTP endpoint (e.g. http://127.0.0.1:9464/readyz) answers 200: for
    /// container health checks, with no curl in the image.
    Health {
        /// http://host:port/path
        url: String,
    },
    /// Dispatch query: the nearest couriers seen recently, searched in expanding rings.
    Nearest(nearest::NearestArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Print a status line this often, e.g. `1s`.
    #[arg(long, value_parser = humantime::parse_duration)]
    status_every: Option<Duration>,
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
        return health::run(url);
    }
    telemetry::init_logs(telemetry::LogFormat::from_env().map_err(anyhow::Error::msg)?);
    let file = match &cli.config {
        Some(p) => FileConfig::from_file(p)?,
        None => FileConfig::default(),
    };
    let config = file.resolve(Overrides {
        mint: mints(&cli.command),
        ..cli.settings.clone()
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
            Command::Token(t) => return t.run(&config),
            Command::Health { .. } => unreachable!("handled before the runtime starts"),
            Command::Simulate(a) => return simulate::run(a, config, shutdown).await,
            Command::Nearest(a) => return nearest::run(a, config).await,
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
        Command::Token(t) => vec![t.audience()],
        Command::Broker(_)
        | Command::Notify(_)
        | Command::Edge(_)
        | Command::Migrate
        | Command::Health { .. }
        | Command::Nearest(_) => vec![],
    }
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
