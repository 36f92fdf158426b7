//! Order events out of the pipeline (docs/events.md).
//!
//! ```text
//! orders API scripts (fanout/src/emit.lua) --XADD, same atomic call as the change--> Redis events stream (bounded)
//!   --> [source: relay, XREADGROUP + XAUTOCLAIM] --one INSERT per batch, unique dedupe key-->
//!   PostgreSQL order_events + webhook_deliveries (the outbox) --XACK + XDEL after the commit
//! [deliver: dispatchers, FOR UPDATE SKIP LOCKED + lease] --POST, Standard Webhooks signature-->
//!   the tenant's endpoints; outcome stored: delivered | retry at (full jitter, Retry-After) | dead
//! [api] the order service registers endpoints, lists and replays dead letters (SERVICE_KEY)
//! [upkeep] gauges (pending, retry age, dead letters, open breakers) each 5 s; pruning hourly
//! ```
//!
//! `retry`, `breaker`, `sign` and `source::parse` are the pure core; `source` (Redis),
//! `outbox` (PostgreSQL), `deliver` (HTTP) and `api` are the edges; `events` counts. Every
//! part is safe to run in several processes at once.

pub(crate) mod api;
pub(crate) mod breaker;
pub mod config;
pub(crate) mod deliver;
pub mod error;
pub mod events;
pub(crate) mod outbox;
pub(crate) mod push;
pub(crate) mod retry;
pub(crate) mod sign;
pub(crate) mod source;

pub use config::NotifyConfig;
pub use error::NotifyError;
pub use events::Stats;

use courier_wire::Keys;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The notify role of one process: relay, dispatcher and upkeep (and the API's routes).
pub struct Notify {
    pub config: NotifyConfig,
    pub redis: courier_wire::RedisTarget,
    pub database_url: String,
    pub keys: Keys,
    pub stats: Arc<Stats>,
}

impl Notify {
    /// The webhooks API's routes, to be served on `HTTP_LISTEN`.
    pub fn router(&self, service_key: String) -> axum::Router {
        api::router(Arc::new(api::Api::new(
            self.database_url.clone(),
            service_key,
        )))
    }

    /// Runs until `shutdown`: then the relay stops taking events (what it took and did not
    /// record stays pending in Redis), and the dispatcher lets its attempts end (each within
    /// `notify.timeout`) and stores their outcomes.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), NotifyError> {
        self.config
            .validate()
            .map_err(|e| NotifyError::Config(e.to_string()))?;
        let http = deliver::http_client()
            .map_err(|e| NotifyError::Config(format!("no TLS root certificates: {e}")))?;
        let consumer = format!("notify-{}-{}", std::process::id(), rand::random::<u32>());
        let relay = source::Relay {
            redis: self.redis.clone(),
            database_url: self.database_url.clone(),
            keys: self.keys.clone(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            consumer,
        };
        let dispatcher = deliver::Dispatcher {
            database_url: self.database_url.clone(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            http,
        };
        // A relay that fails for good (a schema it cannot write) stops the role, and with it
        // the process, rather than leaving events to pile up unseen.
        let stop = shutdown.child_token();
        let upkeep = upkeep(self.database_url.clone(), self.config.clone(), stop.clone());
        let relay_stop = stop.clone();
        let relayed = async move {
            let r = relay.run(relay_stop.clone()).await;
            if let Err(e) = &r {
                tracing::error!(error = %e, "notify relay failed; stopping");
                relay_stop.cancel();
            }
            r
        };
        let (relayed, (), ()) = tokio::join!(relayed, dispatcher.run(stop.clone()), upkeep);
        relayed
    }
}

/// Gauges every 5 s, pruning every hour; PostgreSQL outages only skip a round.
async fn upkeep(database_url: String, config: NotifyConfig, shutdown: CancellationToken) {
    let mut db: Option<tokio_postgres::Client> = None;
    let mut last_prune: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        if db.as_ref().is_none_or(|c| c.is_closed()) {
            db = history_writer::sink::connect(&database_url, "courier-pipeline notify upkeep")
                .await
                .ok();
        }
        let Some(c) = db.as_ref() else { continue };
        match outbox::figures(c).await {
            Ok((pending, oldest, dead, open)) => events::outbox(pending, oldest, dead, open),
            Err(e) => tracing::debug!(error = %e, "notify upkeep: figures skipped"),
        }
        if last_prune.is_none_or(|t| t.elapsed() >= Duration::from_secs(3600)) {
            last_prune = Some(tokio::time::Instant::now());
            match outbox::prune(c, config.keep_delivered, config.keep_dead).await {
                Ok((d, e)) if d + e > 0 => {
                    tracing::info!(
                        deliveries = d,
                        events = e,
                        "notify: pruned past keeping time"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "notify upkeep: prune failed"),
            }
        }
    }
}
