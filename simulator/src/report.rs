//! What the simulator counts while it runs, the progress line, the final line in the reference
//! article's form and the `--report` JSON.

use crate::histogram::Histogram;
use crate::phone::Counts;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Running totals, shared by the tasks of one simulator.
#[derive(Debug, Default)]
pub struct SimStats {
    /// Points written to a connection (its event loop put them on the socket), live and
    /// flushed: what the pipeline is answerable for. A point in a socket that then died is in
    /// here and never reaches the broker: the fault ledgers show that gap.
    pub sent: AtomicU64,
    /// Points handed to a connection's request queue. While a connection is down its queue
    /// holds them (as a phone's app buffers) until it is up again; `queued - sent` are those
    /// still waiting, or left behind when the run ended.
    pub queued: AtomicU64,
    /// `online` status messages handed to a connection.
    pub status_sent: AtomicU64,
    /// Points a courier connection's request queue could not take (connection not keeping up).
    pub client_dropped: AtomicU64,
    /// Connections that are up now, and the most at once.
    pub connections_up: AtomicU64,
    pub connections_max: AtomicU64,
    /// CONNACKs received (reconnects after an outage or restart included).
    pub connects: AtomicU64,
    /// Failed connection attempts (refused, reset, timed out).
    pub connect_errors: AtomicU64,
    /// Updates received by the watchers on `track/<order>`.
    pub watcher_updates: AtomicU64,
    /// Watcher messages that were not a `track/` payload.
    pub watcher_bad: AtomicU64,
    /// The gateway's last known position sent right after SUBSCRIBE (older than the
    /// subscription): not a live point, so not a delay.
    pub watcher_initial: AtomicU64,
    /// Watcher connections that failed, subscriptions refused, tracking tokens not obtained.
    pub watcher_errors: AtomicU64,
    counts: Mutex<Counts>,
    /// Phone-to-viewer delay (receive time minus the point's ts), microseconds: the whole run
    /// and the current second.
    delay: Mutex<(Histogram, Histogram)>,
}

impl SimStats {
    pub(crate) fn add_counts(&self, c: &Counts) {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).add(c);
    }

    pub(crate) fn counts(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn connection_up(&self) {
        let now = self.connections_up.fetch_add(1, Relaxed) + 1;
        self.connections_max.fetch_max(now, Relaxed);
        self.connects.fetch_add(1, Relaxed);
    }

    pub(crate) fn connection_down(&self) {
        self.connections_up.fetch_sub(1, Relaxed);
    }

    /// Records the delays (µs) of a batch of watcher updates.
    pub(crate) fn record_delays(&self, us: &[u64]) {
        let mut d = self.delay.lock().unwrap_or_else(|e| e.into_inner());
        for &v in us {
            d.0.record(v);
            d.1.record(v);
        }
        self.watcher_updates.fetch_add(us.len() as u64, Relaxed);
    }

    /// The delay histogram of the last second, cleared for the next.
    pub(crate) fn take_second(&self) -> Histogram {
        let mut d = self.delay.lock().unwrap_or_else(|e| e.into_inner());
        let h = d.1.clone();
        d.1.clear();
        h
    }

    pub(crate) fn delay_total(&self) -> Histogram {
        self.delay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }
}

/// Milliseconds, rounded to the microsecond.
fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|v| v as f64 / 1000.0)
}

/// Delay figures in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Delay {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Delay {
    pub(crate) fn of(h: &Histogram) -> Delay {
        Delay {
            count: h.count(),
            p50_ms: ms(h.quantile(0.5)),
            p90_ms: ms(h.quantile(0.9)),
            p99_ms: ms(h.quantile(0.99)),
            max_ms: ms((h.count() > 0).then(|| h.max())),
        }
    }
}

/// One second of the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Second {
    pub t: u64,
    pub sent: u64,
    /// Points generated but not yet written (in queues of connections that are down or slow).
    pub waiting: u64,
    pub watcher_updates: u64,
    pub connections_up: u64,
    pub delay_p50_ms: Option<f64>,
    pub delay_p99_ms: Option<f64>,
    /// How the watchers watch (`gateway`, `broker`), `None` without orders; in the report once.
    #[serde(skip)]
    pub watched_via: Option<&'static str>,
}

impl Second {
    /// The progress line printed each second.
    pub fn line(&self) -> String {
        let d = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let via = self
            .watched_via
            .map_or(String::new(), |v| format!(" (via {v})"));
        format!(
            "sim: {:>4}s sent {:>7}/s | waiting {:>6} | conns {:>6} | watchers {:>5} upd/s, delay p50 {} ms p99 {} ms{via}",
            self.t,
            self.sent,
            self.waiting,
            self.connections_up,
            self.watcher_updates,
            d(self.delay_p50_ms),
            d(self.delay_p99_ms)
        )
    }
}

/// Everything the run measured (`--report FILE` writes it as JSON).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub couriers: usize,
    /// Couriers that send (not off shift).
    pub active: usize,
    /// `4s`, or the mix.
    pub interval: String,
    /// `per_courier` or the number of shared connections.
    pub connections: String,
    pub orders: usize,
    /// How the orders were assigned (`orders_api`, `redis`) and watched (`gateway`, `broker`).
    pub assigned_via: String,
    pub watched_via: String,
    /// Orders ended at the end of the run (delivered through the API, or removed from Redis).
    pub orders_ended: usize,
    pub expected_rate: f64,
    pub seconds: f64,
    /// Points written to a connection.
    pub sent: u64,
    pub rate: f64,
    /// Points handed to a connection's queue; `unsent = queued - sent` never reached a socket.
    pub queued: u64,
    pub unsent: u64,
    pub status_sent: u64,
    pub client_dropped: u64,
    pub connects: u64,
    pub connect_errors: u64,
    pub connections_max: u64,
    pub faults: Counts,
    pub watcher_updates: u64,
    pub watcher_bad: u64,
    pub watcher_initial: u64,
    pub watcher_errors: u64,
    pub delay: Delay,
    /// CPU time (user + system) and peak RSS of this simulator process.
    pub cpu_seconds: f64,
    pub max_rss_kib: u64,
    pub per_second: Vec<Second>,
}

impl Report {
    /// The summary line in the reference article's form.
    pub fn line(&self) -> String {
        format!(
            "sim: {} couriers every {} -> expected {:.0} msg/s; sent {} in {:.1}s = {:.0} msg/s{}",
            self.couriers,
            self.interval,
            self.expected_rate,
            self.sent,
            self.seconds,
            self.rate,
            if self.unsent > 0 {
                format!(
                    " ({} generated, never written: their connection was down)",
                    self.unsent
                )
            } else {
                String::new()
            }
        )
    }
}

/// CPU seconds and peak RSS (KiB) of this process so far.
pub(crate) fn own_usage() -> (f64, u64) {
    // SAFETY: getrusage only writes into the struct handed to it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return (0.0, 0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(u.ru_utime) + secs(u.ru_stime), u.ru_maxrss as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            couriers: 2000,
            active: 2000,
            interval: "4s".into(),
            connections: "16".into(),
            orders: 0,
            assigned_via: "redis".into(),
            watched_via: "broker".into(),
            orders_ended: 0,
            expected_rate: 500.0,
            seconds: 31.0,
            sent: 15003,
            rate: 15003.0 / 31.0,
            queued: 15003,
            unsent: 0,
            status_sent: 0,
            client_dropped: 0,
            connects: 16,
            connect_errors: 0,
            connections_max: 16,
            faults: Counts::default(),
            watcher_updates: 0,
            watcher_bad: 0,
            watcher_initial: 0,
            watcher_errors: 0,
            delay: Delay::of(&Histogram::default()),
            cpu_seconds: 1.0,
            max_rss_kib: 1,
            per_second: vec![],
        }
    }

    #[test]
    fn final_line_has_the_article_form() {
        assert_eq!(
            report().line(),
            "sim: 2000 couriers every 4s -> expected 500 msg/s; sent 15003 in 31.0s = 484 msg/s"
        );
        let gap = Report {
            queued: 15_500,
            unsent: 497,
            ..report()
        };
        assert!(gap
            .line()
            .ends_with("484 msg/s (497 generated, never written: their connection was down)"));
    }

    #[test]
    fn progress_line_names_the_watch_path() {
        let mut s = Second {
            t: 3,
            sent: 10,
            waiting: 4,
            watcher_updates: 2,
            connections_up: 1,
            delay_p50_ms: Some(1.25),
            delay_p99_ms: None,
            watched_via: Some("gateway"),
        };
        assert!(
            s.line()
                .ends_with("delay p50 1.2 ms p99 - ms (via gateway)"),
            "{}",
            s.line()
        );
        assert!(
            s.line().contains("sent      10/s | waiting      4 |"),
            "{}",
            s.line()
        );
        s.watched_via = None;
        assert!(s.line().ends_with("p99 - ms"));
        assert!(serde_json::to_value(&s)
            .unwrap()
            .get("watched_via")
            .is_none());
    }

    #[test]
    fn report_json_carries_every_figure() {
        let mut h = Histogram::default();
        for v in [1000, 2000, 3000] {
            h.record(v);
        }
        let r = Report {
            delay: Delay::of(&h),
            ..report()
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for k in [
            "sent",
            "rate",
            "expected_rate",
            "seconds",
            "delay",
            "faults",
            "per_second",
            "cpu_seconds",
            "max_rss_kib",
            "assigned_via",
            "watched_via",
            "orders_ended",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert_eq!(v["delay"]["p50_ms"].as_f64(), Some(2.0));
        assert_eq!(v["delay"]["max_ms"].as_f64(), Some(3.0));
    }

    #[test]
    fn stats_track_connections_and_seconds() {
        let s = SimStats::default();
        s.connection_up();
        s.connection_up();
        s.connection_down();
        assert_eq!(s.connections_up.load(Relaxed), 1);
        assert_eq!(s.connections_max.load(Relaxed), 2);
        s.record_delays(&[500, 1500]);
        assert_eq!(s.take_second().count(), 2);
        assert_eq!(s.take_second().count(), 0);
        assert_eq!(s.delay_total().count(), 2);
        assert_eq!(s.watcher_updates.load(Relaxed), 2);
    }
}
