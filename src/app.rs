//! `run(config, role, opts, shutdown)`: what a command starts, and the order it stops in.
//! Each role runs as one task; the first that fails stops the others. Roles that serve HTTP
//! hand their routes here, and one server on `HTTP_LISTEN` serves them all.

use crate::broker::{self, BrokerError, CURSOR_JUMPS};
use crate::config::{Broker, Config};
use crate::telemetry;
use ingest::{Ingest, IngestError, Stats};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Which roles a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every role, with the embedded broker unless an external one is configured.
    All,
    Ingest,
    Broker,
}

impl Role {
    /// Whether this process runs `other`.
    pub fn runs(self, other: Role) -> bool {
        self == Role::All || self == other
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the broker role needs the embedded broker; unset MQTT_URL")]
    BrokerIsExternal,
    #[error("a role task panicked: {0}")]
    Panicked(String),
}

/// Options of a running process that are not configuration of the pipeline itself.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print a status line this often (the demo uses 1 s).
    pub status_every: Option<Duration>,
}

/// Binds now, so that a port in use is a start-up error rather than a log line.
fn listener(what: &'static str, addr: SocketAddr) -> Result<tokio::net::TcpListener, AppError> {
    let l = std::net::TcpListener::bind(addr).map_err(|source| AppError::Listen { what, addr, source })?;
    l.set_nonblocking(true).map_err(|source| AppError::Listen { what, addr, source })?;
    tokio::net::TcpListener::from_std(l).map_err(|source| AppError::Listen { what, addr, source })
}

/// Runs `role` until `shutdown`, then stops intake, drains and returns.
pub async fn run(config: Config, role: Role, opts: RunOptions, shutdown: CancellationToken) -> Result<(), AppError> {
    let handle = telemetry::install_recorder();
    if let Some(addr) = config.metrics_listen {
        let l = listener("metrics", addr)?;
        let stop = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve_metrics(l, handle, stop).await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        });
    }

    match (&config.broker, role) {
        (Broker::Embedded { listen, config: file }, Role::All | Role::Broker) => {
            let bc = broker::load_config(file.as_deref(), *listen)?;
            broker::start(bc, *listen)?;
            tracing::info!(%listen, "embedded broker listening");
        }
        (Broker::External(_), Role::Broker) => return Err(AppError::BrokerIsExternal),
        _ => {}
    }

    let stats = Arc::new(Stats::default());
    if let Some(every) = opts.status_every {
        tokio::spawn(status_line(stats.clone(), every, shutdown.clone()));
    }

    let mut roles: JoinSet<Result<(), AppError>> = JoinSet::new();
    let routes: Vec<axum::Router> = Vec::new();
    if role.runs(Role::Ingest) {
        let ingest = Ingest {
            config: config.ingest.clone(),
            mqtt: config.broker.endpoint(),
            redis_url: config.redis_url.clone(),
            keys: config.keys.clone(),
            stats,
        };
        tracing::info!(workers = config.ingest.workers, group = %config.ingest.group, "ingest starting");
        let stop = shutdown.clone();
        roles.spawn(async move { Ok(ingest.run(stop).await?) });
    }
    if !routes.is_empty() {
        let l = listener("http", config.http_listen)?;
        let app = routes.into_iter().fold(axum::Router::new(), axum::Router::merge);
        let stop = shutdown.clone();
        roles.spawn(async move {
            axum::serve(l, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .map_err(|source| AppError::Listen { what: "http", addr: config.http_listen, source })
        });
    }
    if roles.is_empty() {
        // The broker alone: it runs on its own threads until the process ends.
        shutdown.cancelled().await;
        return Ok(());
    }

    let mut first_error = None;
    while let Some(joined) = roles.join_next().await {
        let result = joined.map_err(|e| AppError::Panicked(e.to_string())).and_then(|r| r);
        if let Err(e) = result {
            tracing::error!(error = %e, "role failed; stopping the others");
            shutdown.cancel();
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One line per period: rates and totals, no coordinates.
async fn status_line(stats: Arc<Stats>, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    let mut last = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let received = stats.received.load(Relaxed);
        println!(
            "status: in {:>7.0}/s | accepted {} stale {} invalid {} | tracks {} | queue drops {} | redis errors {} | evicted {} | broker loss alerts {}",
            (received - last) as f64 / every.as_secs_f64(),
            stats.accepted.load(Relaxed),
            stats.stale.load(Relaxed),
            stats.invalid.load(Relaxed),
            stats.tracks_published.load(Relaxed),
            stats.queue_dropped.load(Relaxed),
            stats.errors.load(Relaxed),
            stats.evicted_silent.load(Relaxed) + stats.evicted_offline.load(Relaxed),
            CURSOR_JUMPS.load(Relaxed),
        );
        last = received;
    }
}
