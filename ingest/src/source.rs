//! The MQTT edge of ingest: one client per worker in the shared-subscription groups. Its
//! receive loop never awaits Redis: it stamps each message with the receive time and offers it
//! to a bounded queue, dropping (and counting) what does not fit.

use crate::batch::Message;
use crate::events::{Metrics, Stats};
use courier_wire::metrics as m;
use courier_wire::clock::unix_now;
use rumqttc::{AsyncClient, Event, EventLoop, Packet, QoS};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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
    stop: CancellationToken,
    done: CancellationToken,
) {
    let mut tx = Some(tx);
    let mut received = 0u64;
    let mut dropped = 0u64;
    let mut flush = tokio::time::interval(Duration::from_millis(200));
    let connected = metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "connected");
    let disconnected = metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "disconnected");
    loop {
        tokio::select! {
            biased;
            _ = done.cancelled() => break,
            _ = stop.cancelled(), if tx.is_some() => {
                tx = None;
                for f in &filters {
                    let _ = client.try_unsubscribe(f.clone());
                }
            }
            _ = flush.tick() => {
                metrics.received(&stats, received, dropped);
                (received, dropped) = (0, 0);
            }
            ev = eventloop.poll() => match ev {
                Ok(Event::Incoming(Packet::Publish(p))) => {
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
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    connected.increment(1);
                    tracing::info!(filters = ?filters, "mqtt connected; subscribing");
                    if tx.is_some() {
                        for f in &filters {
                            if let Err(e) = client.try_subscribe(f.clone(), QoS::AtMostOnce) {
                                tracing::error!(error = %e, "subscribe request refused");
                            }
                        }
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    if ack.return_codes.iter().any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure)) {
                        tracing::error!("broker refused a subscription");
                    } else {
                        stats.subscriptions_acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    disconnected.increment(1);
                    tracing::warn!(error = %e, "mqtt connection failed; retrying in 1s");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = done.cancelled() => break,
                    }
                }
            }
        }
    }
    metrics.received(&stats, received, dropped);
    let _ = client.try_disconnect();
    // Send what is queued (last tracks, the DISCONNECT) for a moment at most.
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while let Ok(ev) = eventloop.poll().await {
            if matches!(ev, Event::Outgoing(rumqttc::Outgoing::Disconnect)) {
                break;
            }
        }
    })
    .await;
}
