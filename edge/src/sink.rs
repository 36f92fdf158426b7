//! Where the phones' messages go: the bus queue, drained either by the embedded broker's
//! in-process link (`courier-pipeline run`, in the binary's broker module) or, for an edge
//! process of its own, by [`mqtt`]: a few MQTT connections to the bus at `MQTT_URL` with a
//! service login, each courier's messages always on the same one (see [`connection_for`]).

use crate::events::Stats;
use crate::Message;
use courier_wire::metrics as m;
use courier_wire::MqttEndpoint;
use rumqttc::{AsyncClient, Event, Packet, QoS};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Messages one bus client may hold before new ones are dropped (counted as `queue_full`).
const CLIENT_QUEUE: usize = 16_384;

/// The receiving end of the edge's bounded queue to the bus.
pub struct Queue {
    pub(crate) rx: mpsc::Receiver<Message>,
}

impl Queue {
    /// Waits for at least one message (blocking the thread: for a forwarder thread of its
    /// own) and moves up to `limit` into `out`; 0 when the edge has stopped and the queue is
    /// empty.
    pub fn blocking_recv_many(&mut self, out: &mut Vec<Message>, limit: usize) -> usize {
        let n = self.rx.blocking_recv_many(out, limit);
        metrics::gauge!(m::EDGE_QUEUE_DEPTH).set(self.rx.len() as f64);
        n
    }

    /// Async form of [`Queue::blocking_recv_many`].
    pub async fn recv_many(&mut self, out: &mut Vec<Message>, limit: usize) -> usize {
        let n = self.rx.recv_many(out, limit).await;
        metrics::gauge!(m::EDGE_QUEUE_DEPTH).set(self.rx.len() as f64);
        n
    }
}

/// The bus connection (of `n`) that carries the messages of `topic`'s courier: the same one for
/// his points, his status and his Will, so the bus gets them in the order the phone sent them.
/// Round robin per message let a later point (or the Will's `offline`) overtake an earlier one
/// on the other connection: the earlier one was then stale, or the courier live again after
/// his `offline`.
pub fn connection_for(topic: &str, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let key = match courier_wire::parse_courier_topic(topic) {
        Some(courier_wire::CourierTopic::Loc(id) | courier_wire::CourierTopic::Status(id)) => id,
        None => topic,
    };
    // Fixed keys: the same courier maps to the same connection for the life of the process.
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % n.max(1) as u64) as usize
}

/// Forwards `queue` to the bus at `endpoint` over `connections` MQTT connections until the
/// queue closes (the edge stopped and every session ended, its Wills queued), then disconnects.
pub async fn mqtt(endpoint: MqttEndpoint, connections: usize, mut queue: Queue, stats: Arc<Stats>) {
    let tasks = TaskTracker::new();
    // Set once the queue is drained: a client still connecting gives up then.
    let done = CancellationToken::new();
    let mut clients = Vec::with_capacity(connections);
    let up = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for i in 0..connections {
        let o = courier_wire::mqtt::options(
            &endpoint,
            &courier_wire::mqtt::client_id("edge", i),
            CLIENT_QUEUE,
        );
        let (client, mut el) = AsyncClient::new(o, CLIENT_QUEUE);
        courier_wire::mqtt::no_delay(&mut el);
        clients.push(client);
        let (stats, up, done) = (stats.clone(), up.clone(), done.clone());
        tasks.spawn(async move {
            use std::sync::atomic::Ordering::Relaxed;
            let mut connected = false;
            loop {
                let ev = tokio::select! {
                    ev = el.poll() => ev,
                    _ = done.cancelled(), if !connected => break,
                };
                match ev {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if !connected {
                            connected = true;
                            up.fetch_add(1, Relaxed);
                        }
                        stats.bus_up.set(true);
                        metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "connected")
                            .increment(1);
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(e) => {
                        if connected {
                            connected = false;
                            if up.fetch_sub(1, Relaxed) == 1 {
                                stats.bus_up.set(false);
                            }
                            metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "disconnected")
                                .increment(1);
                        }
                        tracing::warn!(role = "edge", error = %e, "bus connection failed; retrying in 1s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    }
    let dropped = metrics::counter!(m::EDGE_MESSAGES, "result" => "queue_full");
    let mut batch = Vec::with_capacity(512);
    while queue.recv_many(&mut batch, 512).await > 0 {
        let mut lost = 0;
        for msg in batch.drain(..) {
            let c = &clients[connection_for(&msg.topic, clients.len())];
            if c.try_publish(msg.topic, QoS::AtMostOnce, false, msg.payload.to_vec())
                .is_err()
            {
                lost += 1;
            }
        }
        if lost > 0 {
            dropped.increment(lost);
            stats
                .queue_full
                .fetch_add(lost, std::sync::atomic::Ordering::Relaxed);
        }
    }
    for c in &clients {
        let _ = c.try_disconnect();
    }
    done.cancel();
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
}

#[cfg(test)]
mod tests {
    use super::connection_for;
    use courier_wire::{loc_topic, status_topic};

    #[test]
    fn one_courier_stays_on_one_connection_and_couriers_spread() {
        let mut used = [0usize; 2];
        for i in 0..100 {
            let id = format!("c{i}");
            let c = connection_for(&loc_topic(&id), 2);
            assert_eq!(c, connection_for(&status_topic(&id), 2), "{id}");
            used[c] += 1;
        }
        assert!(used.iter().all(|&n| n > 20), "{used:?}");
        assert_eq!(connection_for(&loc_topic("c1"), 1), 0);
    }
}
