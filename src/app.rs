//! `run(config, role, shutdown)`: what a command starts, and the order it stops in.

use crate::broker::{self, BrokerError, CURSOR_JUMPS};
use crate::config::{Broker, Config};
use crate::telemetry;
use ingest::{Ingest, IngestError, Stats};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Which roles a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Embedded broker (unless an external one is configured) and ingest.
    All,
    Ingest,
    Broker,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error("metrics listener {addr}: {source}")]
    Metrics { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("the broker role needs the embedded broker; unset MQTT_URL")]
    BrokerIsExternal,
}

/// Options of a running process that are not configuration of the pipeline itself.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print a status line this often (the demo uses 1 s).
    pub status_every: Option<Duration>,
}

/// Runs `role` until `shutdown`, then stops intake, drains and returns.
pub async fn run(config: Config, role: Role, opts: RunOptions, shutdown: CancellationToken) -> Result<(), AppError> {
    let handle = telemetry::install_recorder();
    if let Some(addr) = config.metrics_listen {
        let listener_stop = shutdown.clone();
        // Bind now so that a port in use is a start-up error, not a log line.
        let probe = std::net::TcpListener::bind(addr).map_err(|source| AppError::Metrics { addr, source })?;
        drop(probe);
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve_metrics(addr, handle, listener_stop).await {
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
    match role {
        Role::Broker => {
            shutdown.cancelled().await;
            Ok(())
        }
        Role::All | Role::Ingest => {
            let ingest = Ingest {
                config: config.ingest.clone(),
                mqtt: config.broker.endpoint(),
                redis_url: config.redis_url.clone(),
                keys: config.keys.clone(),
                stats,
            };
            tracing::info!(workers = config.ingest.workers, group = %config.ingest.group, "ingest starting");
            ingest.run(shutdown).await?;
            Ok(())
        }
    }
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
