//! The history path of courier-pipeline: every valid point, kept in day-partitioned
//! PostgreSQL for exactly the retention, and read back by support staff through an audited API.
//!
//! ```text
//! broker --$share/history/couriers/+/loc--> [source: receive loop, validate, stamp order]
//!   --> [buffer: bounded, drops the OLDEST when full] --> [writer: binary COPY, <= 1 s batches]
//!   --> PostgreSQL courier_points (one partition per UTC day of received_at)
//! [orders] Redis courier:order --HGETALL each second--> the snapshot the source stamps from
//! [upkeep] partitions for today + days_ahead; DROP of partitions past retention_days
//! support tool --GET /couriers/{id}/trail + trail token (audience trail) + reason--> [trail]
//!   --> one transaction: read the points + INSERT trail_access_log
//! ```
//!
//! `rows`, `buffer` and the plan in `partitions` are the pure core; `source` (MQTT), `orders`
//! (Redis), `sink` (PostgreSQL COPY), `migrate` and `trail` (HTTP) are the edges; `events`
//! counts. The writer is a separate shared-subscription group from ingest, so a slow database
//! never delays the live locations.

pub mod buffer;
pub mod config;
pub mod error;
pub mod events;
pub mod migrate;
mod orders;
pub mod partitions;
pub mod rows;
pub mod sink;
mod source;
pub mod trail;
mod writer;

pub use config::HistoryConfig;
pub use error::HistoryError;
pub use events::{DropReason, Stats};
pub use migrate::migrate;
pub use trail::Trail;

use buffer::Bounded;
use courier_wire::{Keys, MqttEndpoint, Validation};
use rows::{Orders, Row};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The server clock, unix seconds; tests inject another to move across days.
pub type Clock = Arc<dyn Fn() -> f64 + Send + Sync>;

/// The real clock.
pub fn system_clock() -> Clock {
    Arc::new(courier_wire::clock::unix_now)
}

/// What the receive loops, the order refresher and the writer share.
pub(crate) struct Shared {
    buffer: Mutex<Bounded<Row>>,
    wake: Notify,
    batch_max: usize,
    validation: Validation,
    orders: RwLock<Arc<Orders>>,
    orders_version: AtomicU64,
}

impl Shared {
    fn new(capacity: usize, batch_max: usize, validation: Validation) -> Self {
        Shared {
            buffer: Mutex::new(Bounded::new(capacity)),
            wake: Notify::new(),
            batch_max,
            validation,
            orders: RwLock::new(Arc::new(Orders::new())),
            orders_version: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bounded<Row>> {
        // A panic while holding the lock leaves a consistent VecDeque: keep going.
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a row (dropping the oldest when full); wakes the writer when a batch is full.
    /// Returns how many rows were dropped.
    fn push(&self, row: Row) -> u64 {
        let (dropped, len) = {
            let mut b = self.lock();
            let d = b.push(row);
            (d, b.len())
        };
        if len == self.batch_max {
            self.wake.notify_one();
        }
        dropped
    }

    fn capacity(&self) -> usize {
        self.lock().capacity()
    }

    /// Buffered rows and the receive time of the oldest.
    fn peek(&self) -> (usize, Option<f64>) {
        let b = self.lock();
        (b.len(), b.front().map(|r| r.received_at))
    }

    fn take(&self, max: usize) -> Vec<Row> {
        self.lock().take(max)
    }

    fn requeue(&self, rows: Vec<Row>) -> u64 {
        self.lock().requeue(rows)
    }

    fn orders_snapshot(&self) -> Arc<Orders> {
        self.orders
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_orders(&self, orders: Orders) {
        *self.orders.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(orders);
        self.orders_version.fetch_add(1, Relaxed);
    }
}

/// The history role: MQTT clients in the history group, the writer, partition upkeep and the
/// order snapshot.
pub struct HistoryWriter {
    pub config: HistoryConfig,
    pub mqtt: MqttEndpoint,
    pub database_url: String,
    /// Where `courier:order` is read: one Redis or a cluster (one key per call, so any prefix
    /// works; the pipeline's config still asks a cluster for a hash tag, for the other roles).
    pub redis: courier_wire::RedisTarget,
    /// `courier:order` is `keys.order`.
    pub keys: Keys,
    /// The point limits; the same as ingest's (one setting governs both).
    pub validation: Validation,
    /// Shared with whoever reports progress (status line, tests, the benchmark).
    pub stats: Arc<Stats>,
    /// The clock of partition upkeep.
    pub clock: Clock,
}

impl HistoryWriter {
    /// Connects to PostgreSQL (an error if it is unreachable now), applies the migrations,
    /// runs partition upkeep once, then runs until `shutdown`: intake stops, the buffer is
    /// flushed within `flush_deadline`, and it returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), HistoryError> {
        let mut admin = sink::connect(&self.database_url, "courier-history-upkeep").await?;
        let applied = migrate::migrate(&mut admin).await?;
        self.stats.pg_up.set(true);
        if !applied.is_empty() {
            tracing::info!(versions = ?applied, "history: migrations applied");
        }
        let metrics = Arc::new(events::Metrics::new());
        let cfg = &self.config;
        let out = partitions::upkeep(
            &mut admin,
            (self.clock)(),
            cfg.days_ahead,
            cfg.retention_days,
        )
        .await?;
        report_upkeep(&out, &metrics, &self.stats);

        let shared = Arc::new(Shared::new(cfg.buffer_rows, cfg.batch_max, self.validation));
        let intake = CancellationToken::new();
        let tasks = TaskTracker::new();
        for n in 0..cfg.mqtt_clients {
            tasks.spawn(source::receive(
                n,
                cfg.group.clone(),
                cfg.session.clone(),
                self.mqtt.clone(),
                shared.clone(),
                metrics.clone(),
                self.stats.clone(),
                intake.clone(),
            ));
        }
        tasks.spawn(orders::refresh(
            self.redis.clone(),
            self.keys.order.clone(),
            cfg.order_refresh,
            shared.clone(),
            intake.clone(),
        ));
        tasks.spawn(upkeep_loop(
            admin,
            self.database_url.clone(),
            cfg.clone(),
            self.clock.clone(),
            metrics.clone(),
            self.stats.clone(),
            intake.clone(),
        ));
        let writer_stop = CancellationToken::new();
        let writers = TaskTracker::new();
        for _ in 0..cfg.writers {
            let writer = writer::Writer {
                shared: shared.clone(),
                sink: sink::PgSink::new(&self.database_url),
                config: cfg.clone(),
                metrics: metrics.clone(),
                stats: self.stats.clone(),
            };
            writers.spawn(writer.run(writer_stop.clone()));
        }
        writers.close();

        shutdown.cancelled().await;
        // Stop intake first, so that what the writer flushes is everything there will be.
        intake.cancel();
        tasks.close();
        tasks.wait().await;
        writer_stop.cancel();
        writers.wait().await;
        Ok(())
    }
}

fn report_upkeep(out: &partitions::Outcome, metrics: &events::Metrics, stats: &Stats) {
    if !out.created.is_empty() || !out.dropped.is_empty() {
        tracing::info!(created = ?out.created, dropped = ?out.dropped, "history: partition upkeep");
    }
    metrics.partitions(stats, out.created.len(), out.dropped.len());
}

/// Partition upkeep every `upkeep_every` (sooner after a failure), on its own connection.
async fn upkeep_loop(
    first: tokio_postgres::Client,
    url: String,
    cfg: HistoryConfig,
    clock: Clock,
    metrics: Arc<events::Metrics>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let mut client = Some(first);
    let mut wait = cfg.upkeep_every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let result = async {
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = Some(sink::connect(&url, "courier-history-upkeep").await?);
            }
            let c = client.as_mut().expect("connected above");
            partitions::upkeep(c, clock(), cfg.days_ahead, cfg.retention_days).await
        }
        .await;
        match result {
            Ok(out) => {
                report_upkeep(&out, &metrics, &stats);
                wait = cfg.upkeep_every;
            }
            Err(e) => {
                client = None;
                tracing::warn!(error = %e, "history: partition upkeep failed; retrying soon");
                wait = cfg.upkeep_every.min(Duration::from_secs(10));
            }
        }
    }
}
