//! What the notify role counts: Prometheus metrics (names from `courier_wire::metrics`) and the
//! same counts as atomics for tests and the status line. Updated per batch of events and per
//! attempt, never labelled by order, courier or endpoint.

use courier_wire::metrics as m;
use metrics::{counter, gauge, histogram};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The kinds of event the pipeline emits (the API accepts only these in an endpoint's list).
pub use courier_wire::events::KINDS;

fn kind_label(kind: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

/// Counts of this process.
#[derive(Debug, Default)]
pub struct Stats {
    pub recorded: AtomicU64,
    pub duplicates: AtomicU64,
    pub invalid: AtomicU64,
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub dead: AtomicU64,
    pub notices_sent: AtomicU64,
}

impl Stats {
    pub(crate) fn event(&self, kind: &str, result: &'static str) {
        match result {
            "recorded" => &self.recorded,
            "duplicate" => &self.duplicates,
            _ => &self.invalid,
        }
        .fetch_add(1, Relaxed);
        counter!(m::NOTIFY_EVENTS, "kind" => kind_label(kind), "result" => result).increment(1);
    }

    pub(crate) fn attempt(&self, result: &'static str, took: Duration) {
        match result {
            "delivered" => &self.delivered,
            "retry" => &self.retried,
            _ => &self.dead,
        }
        .fetch_add(1, Relaxed);
        counter!(m::NOTIFY_DELIVERIES, "result" => result).increment(1);
        histogram!(m::NOTIFY_ATTEMPT_SECONDS).record(took.as_secs_f64());
    }
}

/// The stream's figures, read from Redis by the relay.
pub(crate) fn stream(length: u64, dropped: u64) {
    gauge!(m::NOTIFY_STREAM_LENGTH).set(length as f64);
    counter!(m::NOTIFY_EVENTS_DROPPED).absolute(dropped);
}

/// The outbox's figures (every process), read from PostgreSQL by the upkeep task.
pub(crate) fn outbox(pending: i64, oldest_pending: f64, dead: i64, open: i64) {
    gauge!(m::NOTIFY_PENDING).set(pending as f64);
    gauge!(m::NOTIFY_OLDEST_PENDING_SECONDS).set(oldest_pending);
    gauge!(m::NOTIFY_DEAD_LETTERS).set(dead as f64);
    gauge!(m::NOTIFY_BREAKERS_OPEN).set(open as f64);
}

impl Stats {
    pub(crate) fn notice(&self, result: &'static str) {
        if result == "sent" {
            self.notices_sent.fetch_add(1, Relaxed);
        }
        counter!(m::NOTIFY_NOTICES, "result" => result).increment(1);
    }
}

pub(crate) fn api(result: &'static str) {
    counter!(m::NOTIFY_API_REQUESTS, "result" => result).increment(1);
}
