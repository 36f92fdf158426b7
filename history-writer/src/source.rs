//! The MQTT edge: one client in `$share/<group>/couriers/+/loc`. Its receive loop never
//! awaits PostgreSQL or Redis: each message is validated, stamped with the courier's order from
//! the latest `courier:order` snapshot, and pushed into the bounded buffer (which drops its
//! oldest rows when full), all without awaiting anything but the broker.

use crate::events::{DropReason, Metrics, Stats};
use crate::rows::{self, Orders, Refused};
use crate::Shared;
use courier_wire::clock::unix_now;
use courier_wire::mqtt::{Polled, Subscriber};
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

/// Runs one MQTT client until `stop`, then unsubscribes and disconnects.
pub(crate) async fn receive(
    n: usize,
    group: String,
    endpoint: MqttEndpoint,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let role = if group.is_empty() { "history" } else { &group };
    let client_id = courier_wire::mqtt::client_id(role, n);
    let options = courier_wire::mqtt::options(&endpoint, &client_id, 16);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    courier_wire::mqtt::no_delay(&mut eventloop);
    let mut sub = Subscriber::new("history", client, vec![topic::loc_filter(&group)]);
    let mut orders: Arc<Orders> = shared.orders_snapshot();
    let mut orders_version = shared.orders_version.load(Relaxed);
    let (mut received, mut dropped) = (0u64, 0u64);
    let mut invalid = [0u64; Refused::COUNT];
    let mut flush = tokio::time::interval(Duration::from_millis(200));
    let mut drop_log = DropLog::default();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = flush.tick() => {
                metrics.received(&stats, received, &mut invalid);
                metrics.dropped(&stats, DropReason::BufferFull, dropped);
                drop_log.add(dropped, shared.capacity());
                (received, dropped) = (0, 0);
            }
            ev = eventloop.poll() => match sub.handle(ev, &stats.mqtt_up) {
                Polled::Publish(p) => {
                    received += 1;
                    let now = unix_now();
                    let v = shared.orders_version.load(Relaxed);
                    if v != orders_version {
                        orders = shared.orders_snapshot();
                        orders_version = v;
                    }
                    match rows::row(&p.topic, &p.payload, now, &shared.validation, &orders) {
                        Ok(row) => dropped += shared.push(row),
                        Err(r) => invalid[r.index()] += 1,
                    }
                    if received >= 1024 {
                        metrics.received(&stats, received, &mut invalid);
                        metrics.dropped(&stats, DropReason::BufferFull, dropped);
                        drop_log.add(dropped, shared.capacity());
                        (received, dropped) = (0, 0);
                    }
                }
                Polled::Subscribed => {
                    stats.subscriptions_acked.fetch_add(1, Relaxed);
                }
                Polled::Failed => tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => break,
                },
                Polled::Other => {}
            }
        }
    }
    metrics.received(&stats, received, &mut invalid);
    metrics.dropped(&stats, DropReason::BufferFull, dropped);
    sub.stop();
    sub.disconnect(&mut eventloop, Duration::from_millis(500))
        .await;
}
