//! The MQTT edge: one client in `$share/<group>/couriers/+/loc`. Its receive loop never
//! awaits PostgreSQL or Redis: each message is validated, stamped with the courier's order from
//! the latest `courier:order` snapshot, and pushed into the bounded buffer (which drops its
//! oldest rows when full), all without awaiting anything but the broker.

use crate::events::{DropReason, Metrics, Stats};
use crate::rows::{self, Orders, Refused};
use crate::Shared;
use courier_wire::clock::unix_now;
use courier_wire::mqtt::{poll_ticking, Polled, Subscriber};
use courier_wire::{topic, MqttEndpoint};
use rumqttc::AsyncClient;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Logs buffer drops at most every 10 s, with counts only (never a row's content).
#[derive(Default)]
struct DropLog {
    pending: u64,
    last: Option<std::time::Instant>,
}

impl DropLog {
    fn add(&mut self, dropped: u64, capacity: usize) {
        self.pending += dropped;
        if self.pending == 0
            || self
                .last
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        tracing::warn!(
            dropped = self.pending,
            capacity,
            "history buffer full (PostgreSQL slow or down): the oldest rows were dropped"
        );
        self.pending = 0;
        self.last = Some(std::time::Instant::now());
    }
}

/// What the receive loop counts between two metric flushes, and the order snapshot it stamps
/// rows with.
struct Intake {
    orders: Arc<Orders>,
    orders_version: u64,
    received: u64,
    dropped: u64,
    invalid: [u64; Refused::COUNT],
}

impl Intake {
    /// One message: validated, stamped with the courier's order, pushed into the buffer.
    fn take(&mut self, p: &rumqttc::Publish, shared: &Shared) {
        self.received += 1;
        let v = shared.orders_version.load(Relaxed);
        if v != self.orders_version {
            self.orders = shared.orders_snapshot();
            self.orders_version = v;
        }
        match rows::row(
            &p.topic,
            &p.payload,
            unix_now(),
            &shared.validation,
            &self.orders,
        ) {
            Ok(row) => self.dropped += shared.push(row),
            Err(r) => self.invalid[r.index()] += 1,
        }
    }

    fn flush(&mut self, metrics: &Metrics, stats: &Stats, log: &mut DropLog, capacity: usize) {
        metrics.received(stats, self.received, &mut self.invalid);
        metrics.dropped(stats, DropReason::BufferFull, self.dropped);
        log.add(self.dropped, capacity);
        (self.received, self.dropped) = (0, 0);
    }
}

/// Runs one MQTT client until `stop`, then unsubscribes and disconnects; messages that arrive
/// while it disconnects are taken too (written or counted, never lost silently).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn receive(
    n: usize,
    group: String,
    session: Option<String>,
    endpoint: MqttEndpoint,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let role = if group.is_empty() { "history" } else { &group };
    let client_id = match &session {
        Some(s) => format!("{s}-{n}"),
        None => courier_wire::mqtt::client_id(role, n),
    };
    let mut options = courier_wire::mqtt::options(&endpoint, &client_id, 16);
    options.set_clean_session(session.is_none());
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    courier_wire::mqtt::no_delay(&mut eventloop);
    let mut sub = Subscriber::new("history", client, vec![topic::loc_filter(&group)]);
    let mut intake = Intake {
        orders: shared.orders_snapshot(),
        orders_version: shared.orders_version.load(Relaxed),
        received: 0,
        dropped: 0,
        invalid: [0; Refused::COUNT],
    };
    let mut flush = tokio::time::interval(Duration::from_millis(200));
    let mut drop_log = DropLog::default();
    let capacity = shared.capacity();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            ev = poll_ticking(&mut eventloop, &mut flush, || {
                intake.flush(&metrics, &stats, &mut drop_log, capacity)
            }) => match sub.handle(ev, &stats.mqtt_up) {
                Polled::Publish(p) => {
                    intake.take(&p, &shared);
                    if intake.received >= 1024 {
                        intake.flush(&metrics, &stats, &mut drop_log, capacity);
                    }
                }
                Polled::Subscribed => {
                    stats.subscriptions_acked.fetch_add(1, Relaxed);
                }
                Polled::Failed(wait) => tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => break,
                },
                Polled::Other | Polled::Unsubscribed => {}
            }
        }
    }
    // A persistent session keeps its subscription: the broker holds what comes meanwhile.
    if session.is_none() {
        sub.stop();
    }
    let late = sub
        .disconnect(&mut eventloop, Duration::from_millis(500))
        .await;
    for p in &late {
        intake.take(p, &shared);
    }
    intake.flush(&metrics, &stats, &mut drop_log, capacity);
}
