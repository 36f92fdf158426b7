//! What fanout counts: Prometheus metrics (names from `courier_wire::metrics`) and the same
//! figures as plain atomics for tests and benchmarks. Hot counters (points sent and dropped)
//! are added up locally and emitted per batch, never per point.

use courier_wire::metrics as m;
use metrics::{counter, gauge, Counter, Gauge};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a viewer (or one of its requests) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewerRefusal {
    /// Token missing, malformed, unknown key, bad signature, or not a `track` token.
    BadToken,
    /// Token expired (at CONNECT, or while connected).
    ExpiredToken,
    /// The order is unknown or has ended (delivered).
    OrderEnded,
    /// A SUBSCRIBE filter other than `track/<the token's order>`.
    Filter,
    /// The viewer sent a PUBLISH.
    Publish,
    /// Not MQTT, a second CONNECT, a malformed packet, an oversize packet.
    Protocol,
    /// No CONNECT in time, or silent past its keep-alive.
    Timeout,
    /// The gateway holds `max_viewers` already.
    MaxViewers,
    /// Redis could not be asked whether the order runs; the viewer is told to retry
    /// (CONNACK server unavailable / busy).
    Unavailable,
    /// The token is in `max_sessions_per_token` sessions already (a leaked tracking link
    /// shared widely, or a client reconnecting in a loop without closing).
    TokenSessions,
}

impl ViewerRefusal {
    pub(crate) const ALL: [ViewerRefusal; 10] = [
        ViewerRefusal::BadToken,
        ViewerRefusal::ExpiredToken,
        ViewerRefusal::OrderEnded,
        ViewerRefusal::Filter,
        ViewerRefusal::Publish,
        ViewerRefusal::Protocol,
        ViewerRefusal::Timeout,
        ViewerRefusal::MaxViewers,
        ViewerRefusal::Unavailable,
        ViewerRefusal::TokenSessions,
    ];

    /// The `reason` label.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            ViewerRefusal::BadToken => "bad_token",
            ViewerRefusal::ExpiredToken => "expired_token",
            ViewerRefusal::OrderEnded => "order_ended",
            ViewerRefusal::Filter => "filter",
            ViewerRefusal::Publish => "publish",
            ViewerRefusal::Protocol => "protocol",
            ViewerRefusal::Timeout => "timeout",
            ViewerRefusal::MaxViewers => "max_viewers",
            ViewerRefusal::Unavailable => "unavailable",
            ViewerRefusal::TokenSessions => "token_sessions",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Running totals of one gateway process.
#[derive(Debug, Default)]
pub struct Stats {
    /// Viewers whose CONNECT was accepted and who are still connected.
    pub viewers: AtomicU64,
    /// Viewers with an accepted subscription to their order.
    pub subscribed: AtomicU64,
    pub refusals: [AtomicU64; ViewerRefusal::ALL.len()],
    pub points_sent: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_interval: AtomicU64,
    /// `track/+` messages received by the source.
    pub tracks_received: AtomicU64,
    /// SUBACKs of the source's `track/+` subscription: readiness.
    pub source_subscribed: AtomicU64,
    /// The `track/+` subscription is up (readiness).
    pub mqtt_up: courier_wire::health::Up,
    /// Orders ended in this process (by the API or an announcement from another process).
    pub orders_ended: AtomicU64,
}

impl Stats {
    pub fn refused(&self, r: ViewerRefusal) -> u64 {
        self.refusals[r.index()].load(Relaxed)
    }
}

/// What the source handed out since its last flush, counted locally.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Tally {
    pub tracks: u64,
    pub dropped_queue_full: u64,
    pub superseded: u64,
}

/// Metric handles, looked up once.
pub(crate) struct Metrics {
    pub viewers: Gauge,
    refusals: Vec<Counter>,
    sent: Counter,
    dropped_queue_full: Counter,
    dropped_interval: Counter,
    tracks: Counter,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Metrics {
            viewers: gauge!(m::FANOUT_VIEWERS_CONNECTED),
            refusals: ViewerRefusal::ALL
                .iter()
                .map(|r| counter!(m::FANOUT_REFUSALS, "reason" => r.reason()))
                .collect(),
            sent: counter!(m::FANOUT_POINTS_SENT),
            dropped_queue_full: counter!(m::FANOUT_POINTS_DROPPED, "reason" => "queue_full"),
            dropped_interval: counter!(m::FANOUT_POINTS_DROPPED, "reason" => "interval"),
            tracks: counter!(m::FANOUT_TRACKS_RECEIVED),
        }
    }

    pub(crate) fn refused(&self, stats: &Stats, r: ViewerRefusal) {
        self.refusals[r.index()].increment(1);
        stats.refusals[r.index()].fetch_add(1, Relaxed);
    }

    /// One send batch of one viewer.
    pub(crate) fn sent(&self, stats: &Stats, sent: u64) {
        if sent > 0 {
            self.sent.increment(sent);
            stats.points_sent.fetch_add(sent, Relaxed);
        }
    }

    /// What the source handed out since the last flush.
    pub(crate) fn source(&self, stats: &Stats, t: &Tally) {
        let pairs = [
            (&self.tracks, &stats.tracks_received, t.tracks),
            (
                &self.dropped_queue_full,
                &stats.dropped_queue_full,
                t.dropped_queue_full,
            ),
            (
                &self.dropped_interval,
                &stats.dropped_interval,
                t.superseded,
            ),
        ];
        for (c, a, v) in pairs {
            if v > 0 {
                c.increment(v);
                a.fetch_add(v, Relaxed);
            }
        }
    }

    pub(crate) fn viewer_connected(&self, stats: &Stats, up: bool) {
        if up {
            self.viewers.increment(1.0);
            stats.viewers.fetch_add(1, Relaxed);
        } else {
            self.viewers.decrement(1.0);
            stats.viewers.fetch_sub(1, Relaxed);
        }
    }
}

/// Counter of one order-API outcome; labels from fixed sets only.
pub(crate) fn order_event(event: &'static str, result: &'static str) {
    counter!(m::FANOUT_ORDER_EVENTS, "event" => event, "result" => result).increment(1);
}
