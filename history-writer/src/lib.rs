//! The history path of courier-pipeline: every valid point, kept in day-partitioned
//! PostgreSQL for exactly the retention, and read back by support staff through an audited API.
//!
//! ```text
//! broker --$share/history/couriers/+/loc--> [source: receive loop, validate, stamp order]
//!   --> [buffer: bounded, drops the OLDEST when full] --> [writer: binary COPY, <= 1 s batches]
//!   --> PostgreSQL courier_points (one partition per UTC day of received_at)
//! [orders] Redis courier:order --HGETALL each second--> the snapshot the source stamps from
//! [upkeep] partitions for today + days_ahead; DROP of partitions past retention_days (a day
//!   not yet aggregated is kept); audit rows past audit_retention_days deleted
//! [aggregates] each closed hour -> courier_aggregates (cell, hour; >= k couriers), watermark
//! support tool --GET /couriers/{id}/trail + trail token (audience trail) + reason--> [trail]
//!   --> one transaction: read the points + INSERT trail_access_log
//! courier app --GET /couriers/{own id}/own-trail + device token--> [trail] (audited the same)
//! ops --GET /aggregates + trail token--> [aggregates::api]
//! privacy officer --POST /couriers/{id}/erasure + privacy token + reason--> [erasure]
//!   --> one transaction: DELETE points, Redis state, INSERT erasure_log
//! ```
//!
//! `rows`, `buffer` and the plan in `partitions` are the pure core; `source` (MQTT), `orders`
//! (Redis), `sink` (PostgreSQL COPY), `migrate` and `trail` (HTTP) are the edges; `events`
//! counts. The writer is a separate shared-subscription group from ingest, so a slow database
//! never delays the live locations.

pub mod aggregate_api;
pub mod aggregates;
pub mod audit;
pub(crate) mod buffer;
pub mod config;
pub mod erasure;
pub mod error;
pub mod events;
pub mod geohash;
pub mod migrate;
mod orders;
pub mod partitions;
mod pool;
pub mod rows;
pub mod sink;
mod source;
pub mod trail;
mod writer;

pub use aggregate_api::AggregateApi;
pub use config::HistoryConfig;
pub use erasure::Erasure;
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
    /// runs upkeep once ([`upkeep_once`]), then runs until `shutdown`: intake stops, the buffer
    /// is flushed within `flush_deadline`, and it returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), HistoryError> {
        let mut admin = sink::connect(&self.database_url, "courier-history-upkeep").await?;
        let applied = migrate::migrate(&mut admin).await?;
        self.stats.pg_up.set(true);
        if !applied.is_empty() {
            tracing::info!(versions = ?applied, "history: migrations applied");
        }
        let metrics = Arc::new(events::Metrics::new());
        let cfg = &self.config;
        upkeep_once(&mut admin, cfg, (self.clock)(), &metrics, &self.stats).await?;

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
        if cfg.aggregates {
            tasks.spawn(aggregate_loop(
                self.database_url.clone(),
                cfg.clone(),
                self.clock.clone(),
                intake.clone(),
            ));
        }
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
    if !out.held.is_empty() {
        tracing::info!(held = ?out.held, "history: partitions past retention kept until aggregated");
    }
    metrics.partitions(stats, out.created.len(), out.dropped.len());
    metrics::gauge!(courier_wire::metrics::HISTORY_PARTITIONS_HELD).set(out.held.len() as f64);
}

/// Deletes audit rows past their retention; a failure is logged and retried at the next upkeep.
async fn expire_audit(client: &tokio_postgres::Client, now: f64, days: u32) {
    match audit::expire(client, now, days).await {
        Ok(e) => {
            for (log, n) in [("trail_access", e.trail_access), ("erasure", e.erasure)] {
                if n > 0 {
                    metrics::counter!(courier_wire::metrics::AUDIT_ROWS_EXPIRED, "log" => log)
                        .increment(n);
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "history: audit log retention failed; retrying at the next upkeep")
        }
    }
}

/// The aggregator: every `aggregate_every`, the closed hours after the watermark, on its own
/// connection (a long catch-up never delays partition upkeep).
async fn aggregate_loop(url: String, cfg: HistoryConfig, clock: Clock, stop: CancellationToken) {
    use courier_wire::metrics as m;
    let settings = aggregates::RunSettings {
        min_couriers: cfg.aggregate_min_couriers,
        delay: cfg.aggregate_delay,
        retention_days: cfg.aggregate_retention_days,
        max_hours: 24,
    };
    let mut client: Option<tokio_postgres::Client> = None;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let started = std::time::Instant::now();
        let run = async {
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = Some(sink::connect(&url, "courier-history-aggregates").await?);
            }
            let c = client.as_mut().expect("connected above");
            aggregates::run_pending(c, clock(), &settings).await
        };
        // A catch-up (up to max_hours, seconds each) or a wait for another writer's lock on
        // the watermark must not hold up shutdown: stopping drops the run, its connection
        // closes and PostgreSQL rolls the open hour back (each hour is one transaction, so
        // the watermark never moves past an unwritten hour).
        let result = tokio::select! {
            _ = stop.cancelled() => return,
            r = run => r,
        };
        match result {
            Ok(out) => {
                if out.hours > 0 {
                    metrics::counter!(m::AGGREGATE_HOURS).increment(u64::from(out.hours));
                    metrics::counter!(m::AGGREGATE_CELLS).increment(out.cells);
                    metrics::histogram!(m::AGGREGATE_HOUR_SECONDS)
                        .record(started.elapsed().as_secs_f64() / f64::from(out.hours));
                    tracing::info!(
                        hours = out.hours,
                        cells = out.cells,
                        "history: hours aggregated"
                    );
                }
                metrics::gauge!(m::AGGREGATE_LAG_SECONDS).set(clock() - out.done_until as f64);
                // A run that hit max_hours has more to do: go on at once.
                wait = if out.hours >= settings.max_hours {
                    Duration::ZERO
                } else {
                    cfg.aggregate_every
                };
            }
            Err(e) => {
                client = None;
                metrics::counter!(m::AGGREGATE_ERRORS).increment(1);
                tracing::warn!(error = %e, "history: aggregation failed; retrying");
                wait = cfg.aggregate_every.min(Duration::from_secs(10));
            }
        }
    }
}

/// One round of upkeep: the partitions (created ahead, dropped past retention) unless
/// `partition_upkeep` is off (pg_partman or an operator keeps them), and the audit rows past
/// their retention.
async fn upkeep_once(
    c: &mut tokio_postgres::Client,
    cfg: &HistoryConfig,
    now: f64,
    metrics: &events::Metrics,
    stats: &Stats,
) -> Result<(), HistoryError> {
    if cfg.partition_upkeep {
        let out =
            partitions::upkeep(c, now, cfg.days_ahead, cfg.retention_days, cfg.aggregates).await?;
        report_upkeep(&out, metrics, stats);
    }
    expire_audit(c, now, cfg.audit_retention_days).await;
    Ok(())
}

/// [`upkeep_once`] every `upkeep_every` (sooner after a failure), on its own connection.
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
            upkeep_once(c, &cfg, clock(), &metrics, &stats).await
        }
        .await;
        match result {
            Ok(()) => wait = cfg.upkeep_every,
            Err(e) => {
                client = None;
                tracing::warn!(error = %e, "history: partition upkeep failed; retrying soon");
                wait = cfg.upkeep_every.min(Duration::from_secs(10));
            }
        }
    }
}
