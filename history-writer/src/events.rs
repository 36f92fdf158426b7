//! What the history writer counts: Prometheus metrics (names from `courier_wire::metrics`) and
//! the same figures as plain atomics for the status line, tests and the benchmark. Updated
//! once per batch (the receive loop flushes its counts every 1,024 messages or 200 ms).

use crate::rows::Refused;
use courier_wire::metrics as m;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why rows left the buffer without being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The buffer was full: the oldest made room.
    BufferFull,
    /// Their day had no partition and creating it failed.
    NoPartition,
    /// PostgreSQL refused the row itself (not the connection).
    Rejected,
    /// Not flushed within the shutdown deadline.
    Shutdown,
}

impl DropReason {
    pub(crate) const ALL: [DropReason; 4] = [
        DropReason::BufferFull,
        DropReason::NoPartition,
        DropReason::Rejected,
        DropReason::Shutdown,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            DropReason::BufferFull => "buffer_full",
            DropReason::NoPartition => "no_partition",
            DropReason::Rejected => "rejected",
            DropReason::Shutdown => "shutdown",
        }
    }
}

/// Receipt-to-commit times in fixed log-spaced buckets (0.5 ms .. about 60 s, x1.25), for
/// quantiles without keeping samples.
#[derive(Debug)]
pub struct LagHistogram {
    buckets: [AtomicU64; LAG_BUCKETS],
}

const LAG_BUCKETS: usize = 56;
const LAG_FIRST: f64 = 0.0005;
const LAG_FACTOR: f64 = 1.25;

impl Default for LagHistogram {
    fn default() -> Self {
        LagHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl LagHistogram {
    /// Upper bound (seconds) of bucket `i`; the last one is open.
    pub(crate) fn upper(i: usize) -> f64 {
        LAG_FIRST * LAG_FACTOR.powi(i as i32)
    }

    pub(crate) fn bucket(secs: f64) -> usize {
        // NaN and anything up to the first bound land in the first bucket.
        if secs.is_nan() || secs <= LAG_FIRST {
            return 0;
        }
        (((secs / LAG_FIRST).ln() / LAG_FACTOR.ln()).ceil() as usize).min(LAG_BUCKETS - 1)
    }

    /// Adds per-bucket counts gathered locally.
    pub(crate) fn add(&self, counts: &[u64; LAG_BUCKETS]) {
        for (b, n) in self.buckets.iter().zip(counts) {
            if *n > 0 {
                b.fetch_add(*n, Relaxed);
            }
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// The upper bound of the bucket holding quantile `q` (0..=1); 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let total = self.count();
        if total == 0 {
            return 0.0;
        }
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= rank {
                return Self::upper(i);
            }
        }
        Self::upper(LAG_BUCKETS - 1)
    }

    pub fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Relaxed);
        }
    }
}

/// Local bucket counts of one batch.
pub(crate) type LagCounts = [u64; LAG_BUCKETS];

/// Running totals of one process's history writer.
#[derive(Debug, Default)]
pub struct Stats {
    pub received: AtomicU64,
    pub invalid: AtomicU64,
    pub invalid_by_reason: [AtomicU64; Refused::COUNT],
    pub written: AtomicU64,
    pub dropped_by_reason: [AtomicU64; 4],
    pub batches: AtomicU64,
    /// Time spent in successful COPYs (with their commits), microseconds.
    pub copy_micros: AtomicU64,
    /// COPY attempts that failed (the rows went back to the buffer or were dropped).
    pub copy_failures: AtomicU64,
    pub buffer_depth: AtomicU64,
    pub partitions_created: AtomicU64,
    pub partitions_dropped: AtomicU64,
    /// SUBACKs received by the MQTT clients: readiness.
    pub subscriptions_acked: AtomicU64,
    /// The MQTT connection is subscribed (readiness).
    pub mqtt_up: courier_wire::health::Up,
    /// The last PostgreSQL write (or start-up check) succeeded (readiness).
    pub pg_up: courier_wire::health::Up,
    pub commit_lag: LagHistogram,
}

impl Stats {
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped_by_reason[reason as usize].load(Relaxed)
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped_by_reason.iter().map(|a| a.load(Relaxed)).sum()
    }

    pub fn invalid_for(&self, reason: Refused) -> u64 {
        self.invalid_by_reason[reason.index()].load(Relaxed)
    }
}

/// Metric handles, looked up once.
/// Why a COPY failed (`kind` label of `history_copy_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyError {
    /// The connection or the server (down, restarting, overloaded): retried.
    Retryable = 0,
    /// PostgreSQL refuses every row (read-only, permissions, schema): the batch is kept.
    Database = 1,
    /// A row's fault: the batch is split to find it.
    Data = 2,
}

pub(crate) struct Metrics {
    received: Counter,
    written: Counter,
    dropped: Vec<Counter>,
    invalid: Vec<Counter>,
    buffer_depth: Gauge,
    pub batch_size: Histogram,
    pub copy_seconds: Histogram,
    commit_lag: Histogram,
    partitions_created: Counter,
    partitions_dropped: Counter,
    copy_errors: [Counter; 3],
}

impl Metrics {
    pub(crate) fn copy_error(&self, kind: CopyError) {
        self.copy_errors[kind as usize].increment(1);
    }

    pub(crate) fn new() -> Self {
        Metrics {
            received: counter!(m::HISTORY_ROWS_RECEIVED),
            written: counter!(m::HISTORY_ROWS_WRITTEN),
            dropped: DropReason::ALL
                .iter()
                .map(|r| counter!(m::HISTORY_ROWS_DROPPED, "reason" => r.label()))
                .collect(),
            invalid: Refused::all()
                .map(|r| counter!(m::HISTORY_INVALID, "reason" => r.reason()))
                .collect(),
            buffer_depth: gauge!(m::HISTORY_BUFFER_DEPTH),
            batch_size: histogram!(m::HISTORY_BATCH_SIZE),
            copy_seconds: histogram!(m::HISTORY_COPY_SECONDS),
            commit_lag: histogram!(m::HISTORY_COMMIT_LAG_SECONDS),
            partitions_created: counter!(m::HISTORY_PARTITIONS_CREATED),
            partitions_dropped: counter!(m::HISTORY_PARTITIONS_DROPPED),
            copy_errors: ["retryable", "database", "data"]
                .map(|k| counter!(m::HISTORY_COPY_ERRORS, "kind" => k)),
        }
    }

    /// What one receive loop counted since its last flush.
    pub(crate) fn received(
        &self,
        stats: &Stats,
        received: u64,
        invalid: &mut [u64; Refused::COUNT],
    ) {
        if received > 0 {
            self.received.increment(received);
            stats.received.fetch_add(received, Relaxed);
        }
        for (i, n) in invalid.iter_mut().enumerate() {
            if *n > 0 {
                self.invalid[i].increment(*n);
                stats.invalid_by_reason[i].fetch_add(*n, Relaxed);
                stats.invalid.fetch_add(*n, Relaxed);
                *n = 0;
            }
        }
    }

    pub(crate) fn dropped(&self, stats: &Stats, reason: DropReason, n: u64) {
        if n > 0 {
            self.dropped[reason as usize].increment(n);
            stats.dropped_by_reason[reason as usize].fetch_add(n, Relaxed);
        }
    }

    pub(crate) fn depth(&self, stats: &Stats, depth: usize) {
        self.buffer_depth.set(depth as f64);
        stats.buffer_depth.store(depth as u64, Relaxed);
    }

    /// A committed batch: its rows and their receipt-to-commit times.
    pub(crate) fn written(&self, stats: &Stats, rows: u64, lags: &[f64]) {
        self.written.increment(rows);
        stats.written.fetch_add(rows, Relaxed);
        stats.pg_up.set(true);
        stats.batches.fetch_add(1, Relaxed);
        let mut counts: LagCounts = [0; LAG_BUCKETS];
        for &l in lags {
            counts[LagHistogram::bucket(l)] += 1;
            self.commit_lag.record(l);
        }
        stats.commit_lag.add(&counts);
    }

    pub(crate) fn partitions(&self, stats: &Stats, created: usize, dropped: usize) {
        if created > 0 {
            self.partitions_created.increment(created as u64);
            stats.partitions_created.fetch_add(created as u64, Relaxed);
        }
        if dropped > 0 {
            self.partitions_dropped.increment(dropped as u64);
            stats.partitions_dropped.fetch_add(dropped as u64, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_in_the_right_bucket() {
        let h = LagHistogram::default();
        let mut c: LagCounts = [0; LAG_BUCKETS];
        for i in 0..1000 {
            c[LagHistogram::bucket(if i < 990 { 0.010 } else { 0.5 })] += 1;
        }
        h.add(&c);
        let p50 = h.quantile(0.5);
        assert!((0.010..0.0125 + 1e-9).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((0.010..0.0125 + 1e-9).contains(&p99), "{p99}");
        let p999 = h.quantile(0.999);
        assert!((0.5..0.625 + 1e-9).contains(&p999), "{p999}");
        assert_eq!(LagHistogram::bucket(-1.0), 0);
        assert_eq!(LagHistogram::bucket(1e9), LAG_BUCKETS - 1);
        assert!(LagHistogram::upper(LAG_BUCKETS - 2) > 60.0);
    }
}
