//! What ingest counts: Prometheus metrics (names from `courier_wire::metrics`) and the same
//! figures as plain atomics for the status line and tests. Both are updated once per batch.

use courier_wire::metrics as m;
use courier_wire::Invalid;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Running totals of one process's ingest workers.
#[derive(Debug, Default)]
pub struct Stats {
    pub received: AtomicU64,
    pub accepted: AtomicU64,
    pub stale: AtomicU64,
    pub invalid: AtomicU64,
    pub invalid_by_reason: [AtomicU64; Invalid::ALL.len()],
    pub queue_dropped: AtomicU64,
    pub errors: AtomicU64,
    pub seq_resets: AtomicU64,
    pub tracks_published: AtomicU64,
    pub tracks_dropped: AtomicU64,
    /// Arrivals reported (`courier.arriving_*` events written).
    pub arrivals: AtomicU64,
    pub evicted_silent: AtomicU64,
    pub evicted_offline: AtomicU64,
    /// `offline` statuses lost with a failed batch (the courier stays live until the sweep).
    pub status_errors: AtomicU64,
    pub batches: AtomicU64,
    /// SUBACKs received by the workers (two per worker per connection): readiness.
    pub subscriptions_acked: AtomicU64,
    /// The MQTT connection is subscribed (readiness).
    pub mqtt_up: courier_wire::health::Up,
    /// The last Redis call succeeded (readiness).
    pub redis_up: courier_wire::health::Up,
}

impl Stats {
    pub fn invalid_for(&self, reason: Invalid) -> u64 {
        self.invalid_by_reason[reason.index()].load(Relaxed)
    }

    /// Points that reached a verdict (accepted, stale, invalid or error).
    pub fn settled(&self) -> u64 {
        self.accepted.load(Relaxed)
            + self.stale.load(Relaxed)
            + self.invalid.load(Relaxed)
            + self.errors.load(Relaxed)
    }
}

/// Outcome of one batch, counted locally and then emitted in one go.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub accepted: u64,
    pub stale: u64,
    pub invalid: [u64; Invalid::ALL.len()],
    pub errors: u64,
    pub seq_resets: u64,
    pub offline: u64,
    /// `offline` statuses of batches that did not reach Redis.
    pub status_errors: u64,
    pub tracks_published: u64,
    pub tracks_dropped: u64,
    /// Arrival events written for this batch.
    pub arrivals: u64,
}

impl Tally {
    pub(crate) fn invalid_total(&self) -> u64 {
        self.invalid.iter().sum()
    }
}

/// Metric handles, looked up once.
pub(crate) struct Metrics {
    accepted: Counter,
    stale: Counter,
    invalid: Counter,
    error: Counter,
    invalid_reason: Vec<Counter>,
    received: Counter,
    queue_dropped: Counter,
    pub queue_depth: Gauge,
    pub batch_size: Histogram,
    pub redis_seconds: Histogram,
    pub phone_lag: Histogram,
    redis_retryable: Counter,
    redis_fatal: Counter,
    resets: Counter,
    tracks: Counter,
    tracks_dropped: Counter,
    arrivals: Counter,
    evicted_silent: Counter,
    evicted_offline: Counter,
    status_errors: Counter,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Metrics {
            accepted: counter!(m::INGEST_POINTS, "result" => "accepted"),
            stale: counter!(m::INGEST_POINTS, "result" => "stale"),
            invalid: counter!(m::INGEST_POINTS, "result" => "invalid"),
            error: counter!(m::INGEST_POINTS, "result" => "error"),
            invalid_reason: Invalid::ALL
                .iter()
                .map(|r| counter!(m::INGEST_INVALID, "reason" => r.reason()))
                .collect(),
            received: counter!(m::INGEST_RECEIVED),
            queue_dropped: counter!(m::INGEST_QUEUE_DROPPED, "reason" => "queue_full"),
            queue_depth: gauge!(m::INGEST_QUEUE_DEPTH),
            batch_size: histogram!(m::INGEST_BATCH_SIZE),
            redis_seconds: histogram!(m::INGEST_REDIS_SECONDS),
            phone_lag: histogram!(m::INGEST_PHONE_LAG_SECONDS),
            redis_retryable: counter!(m::INGEST_REDIS_ERRORS, "kind" => "retryable"),
            redis_fatal: counter!(m::INGEST_REDIS_ERRORS, "kind" => "fatal"),
            resets: counter!(m::INGEST_SEQ_RESETS),
            tracks: counter!(m::INGEST_TRACKS_PUBLISHED),
            tracks_dropped: counter!(m::INGEST_TRACKS_DROPPED),
            arrivals: counter!(m::INGEST_ARRIVALS),
            evicted_silent: counter!(m::INGEST_EVICTED, "reason" => "silent"),
            evicted_offline: counter!(m::INGEST_EVICTED, "reason" => "offline"),
            status_errors: counter!(m::INGEST_STATUS_ERRORS),
        }
    }

    pub(crate) fn received(&self, stats: &Stats, n: u64, dropped: u64) {
        self.received.increment(n);
        stats.received.fetch_add(n, Relaxed);
        if dropped > 0 {
            self.queue_dropped.increment(dropped);
            stats.queue_dropped.fetch_add(dropped, Relaxed);
        }
    }

    pub(crate) fn batch(&self, stats: &Stats, t: &Tally) {
        let pairs = [
            (&self.accepted, &stats.accepted, t.accepted),
            (&self.stale, &stats.stale, t.stale),
            (&self.invalid, &stats.invalid, t.invalid_total()),
            (&self.error, &stats.errors, t.errors),
            (&self.resets, &stats.seq_resets, t.seq_resets),
            (&self.tracks, &stats.tracks_published, t.tracks_published),
            (
                &self.tracks_dropped,
                &stats.tracks_dropped,
                t.tracks_dropped,
            ),
            (&self.arrivals, &stats.arrivals, t.arrivals),
            (&self.evicted_offline, &stats.evicted_offline, t.offline),
            (&self.status_errors, &stats.status_errors, t.status_errors),
        ];
        for (c, a, v) in pairs {
            if v > 0 {
                c.increment(v);
                a.fetch_add(v, Relaxed);
            }
        }
        for (i, &v) in t.invalid.iter().enumerate() {
            if v > 0 {
                self.invalid_reason[i].increment(v);
                stats.invalid_by_reason[i].fetch_add(v, Relaxed);
            }
        }
        stats.batches.fetch_add(1, Relaxed);
    }

    pub(crate) fn redis_error(&self, retryable: bool) {
        if retryable {
            self.redis_retryable.increment(1)
        } else {
            self.redis_fatal.increment(1)
        }
    }

    pub(crate) fn evicted_silent(&self, stats: &Stats, n: u64) {
        self.evicted_silent.increment(n);
        stats.evicted_silent.fetch_add(n, Relaxed);
    }
}
