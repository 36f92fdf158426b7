//! What the edge counts: Prometheus metrics (names from `courier_wire::metrics`, handles looked
//! up once) and the same figures as plain atomics for tests and benchmarks. Labels come from
//! fixed sets; never a courier id.

use crate::policy::Refusal;
use courier_wire::metrics as m;
use metrics::{counter, gauge, Counter, Gauge};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The transport a phone came in on (`transport` label of logins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Tcp,
    Tls,
    Ws,
}

impl Via {
    pub fn label(self) -> &'static str {
        match self {
            Via::Tcp => "tcp",
            Via::Tls => "tls",
            Via::Ws => "ws",
        }
    }
}

/// Running totals of one edge process.
#[derive(Debug, Default)]
pub struct Stats {
    /// Phones logged in now.
    pub connected: AtomicU64,
    /// Logins accepted since start.
    pub logins: AtomicU64,
    pub refusals: [AtomicU64; Refusal::ALL.len()],
    /// Messages handed to the bus queue.
    pub forwarded: AtomicU64,
    /// Messages over the courier's rate, dropped.
    pub rate_limited: AtomicU64,
    /// Points of couriers off shift (after their own `offline`), dropped at the door.
    pub off_shift: AtomicU64,
    /// Messages dropped because the queue to the bus was full (or the bus client's).
    pub queue_full: AtomicU64,
    pub wills: AtomicU64,
    pub takeovers: AtomicU64,
    /// The bus connection is up (readiness).
    pub bus_up: courier_wire::health::Up,
}

impl Stats {
    pub fn refused(&self, r: Refusal) -> u64 {
        self.refusals[r as usize].load(Relaxed)
    }

    /// Every refusal counted, whatever the reason.
    pub fn refused_total(&self) -> u64 {
        self.refusals.iter().map(|a| a.load(Relaxed)).sum()
    }
}

/// Metric handles of one process.
pub(crate) struct Metrics {
    connected: Gauge,
    logins: [Counter; 3],
    refusals: Vec<Counter>,
    forwarded: Counter,
    rate_limited: Counter,
    off_shift: Counter,
    queue_full: Counter,
    wills: Counter,
    takeovers: Counter,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Metrics {
            connected: gauge!(m::EDGE_CONNECTIONS),
            logins: [Via::Tcp, Via::Tls, Via::Ws]
                .map(|v| counter!(m::EDGE_LOGINS, "transport" => v.label())),
            refusals: Refusal::ALL
                .iter()
                .map(|r| counter!(m::EDGE_REFUSALS, "reason" => r.reason()))
                .collect(),
            forwarded: counter!(m::EDGE_MESSAGES, "result" => "forwarded"),
            rate_limited: counter!(m::EDGE_MESSAGES, "result" => "rate_limited"),
            off_shift: counter!(m::EDGE_MESSAGES, "result" => "off_shift"),
            queue_full: counter!(m::EDGE_MESSAGES, "result" => "queue_full"),
            wills: counter!(m::EDGE_WILLS),
            takeovers: counter!(m::EDGE_TAKEOVERS),
        }
    }

    pub(crate) fn refused(&self, stats: &Stats, r: Refusal) {
        self.refusals[r as usize].increment(1);
        stats.refusals[r as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn login(&self, stats: &Stats, via: Via) {
        self.logins[via as usize].increment(1);
        stats.logins.fetch_add(1, Relaxed);
        self.connected.increment(1.0);
        stats.connected.fetch_add(1, Relaxed);
    }

    pub(crate) fn logout(&self, stats: &Stats) {
        self.connected.decrement(1.0);
        stats.connected.fetch_sub(1, Relaxed);
    }

    pub(crate) fn forwarded(&self, stats: &Stats) {
        self.forwarded.increment(1);
        stats.forwarded.fetch_add(1, Relaxed);
    }

    pub(crate) fn rate_limited(&self, stats: &Stats) {
        self.rate_limited.increment(1);
        stats.rate_limited.fetch_add(1, Relaxed);
    }

    pub(crate) fn off_shift(&self, stats: &Stats) {
        self.off_shift.increment(1);
        stats.off_shift.fetch_add(1, Relaxed);
    }

    pub(crate) fn queue_full(&self, stats: &Stats, n: u64) {
        self.queue_full.increment(n);
        stats.queue_full.fetch_add(n, Relaxed);
    }

    pub(crate) fn will(&self, stats: &Stats) {
        self.wills.increment(1);
        stats.wills.fetch_add(1, Relaxed);
    }

    pub(crate) fn takeover(&self, stats: &Stats) {
        self.takeovers.increment(1);
        stats.takeovers.fetch_add(1, Relaxed);
    }
}
