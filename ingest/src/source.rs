//! The MQTT edge of ingest: one client per worker in the shared-subscription groups. Its
//! receive loop never awaits Redis: it stamps each message with the receive time and offers it
//! to a bounded queue, dropping (and counting) what does not fit.

use crate::batch::Message;
use crate::events::{Metrics, Stats};
use courier_wire::clock::unix_now;
use courier_wire::mqtt::{poll_ticking, Polled, Subscriber};
use rumqttc::{AsyncClient, EventLoop};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// When a receive loop ends: `stop` ends intake; `done` says the writer has drained the queue
/// (the connection is serviced until then, for the last tracks).
pub(crate) struct Lifetime {
    pub stop: CancellationToken,
    pub done: CancellationToken,
}

/// Runs the receive loop until `stop`; then unsubscribes, closes the queue (so the writer
/// drains it) and keeps the connection serviced until `done`, so that the tracks of the last
/// batches still go out, and finally disconnects.
pub(crate) async fn receive(
    mut eventloop: EventLoop,
    client: AsyncClient,
    filters: Vec<String>,
    tx: mpsc::Sender<Message>,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    lifetime: Lifetime,
) {
    let Lifetime { stop, done } = lifetime;
    let unsubscribes = filters.len();
    let mut sub = Subscriber::new("ingest", client, filters);
    let mut tx = Some(tx);
    // After `stop`: the UNSUBACKs still awaited, and how long to wait for them. Points keep
    // going into the queue until the broker has taken every UNSUBSCRIBE (it may route more
    // to this worker until then: a rolling restart dropped them), then the queue closes.
    let mut draining: Option<usize> = None;
    // Armed at `stop`; one timer for the whole loop, not one built per message.
    let drain_deadline = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
    tokio::pin!(drain_deadline);
    let mut received = 0u64;
    let mut dropped = 0u64;
    let mut flush = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            biased;
            _ = done.cancelled() => break,
            _ = stop.cancelled(), if draining.is_none() && tx.is_some() => {
                sub.stop();
                draining = Some(unsubscribes);
                drain_deadline.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(1));
            }
            _ = &mut drain_deadline, if draining.is_some() && tx.is_some() => {
                tracing::warn!("no UNSUBACK within 1 s of stopping; closing the queue");
                tx = None;
            }
            ev = poll_ticking(&mut eventloop, &mut flush, || {
                metrics.received(&stats, received, dropped);
                (received, dropped) = (0, 0);
            }) => match sub.handle(ev, &stats.mqtt_up) {
                Polled::Publish(p) => {
                    received += 1;
                    let Some(q) = &tx else { dropped += 1; continue };
                    let msg = Message { topic: p.topic, payload: p.payload, received: unix_now() };
                    if q.try_send(msg).is_err() {
                        dropped += 1;
                    }
                    if received >= 1024 {
                        metrics.received(&stats, received, dropped);
                        (received, dropped) = (0, 0);
                    }
                }
                Polled::Subscribed => {
                    stats.subscriptions_acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Polled::Unsubscribed => {
                    if let Some(left) = draining.as_mut() {
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            tx = None;
                        }
                    }
                }
                Polled::Failed(wait) => tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = done.cancelled() => break,
                },
                Polled::Other => {}
            }
        }
    }
    // Send what is queued (last tracks, the DISCONNECT) for a moment at most. Points that arrive
    // meanwhile come after the queue closed: received and dropped, as after `stop`.
    let late = sub
        .disconnect(&mut eventloop, Duration::from_millis(500))
        .await
        .len() as u64;
    metrics.received(&stats, received + late, dropped + late);
}
