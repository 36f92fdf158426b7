//! Customers watching their orders: how orders are assigned to couriers, and how a customer
//! sees the courier, measuring the phone-to-viewer delay (receive time minus the point's ts).
//!
//! Today both go the direct way: the assignment is written into `courier:order` in Redis and
//! the watcher subscribes to `track/<order>` on the broker. The orders API (assign with a
//! service key, a tracking token per order) and the viewer gateway (MQTT over WebSocket with
//! that token) are further variants of [`Assigner`] and [`Viewer`]; the rest of the simulator
//! does not change when they are added.

use crate::report::SimStats;
use crate::SimError;
use courier_wire::{clock::unix_now, Keys, MqttEndpoint};
use rumqttc::{AsyncClient, Event, Packet, QoS};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How orders get their courier.
#[derive(Debug, Clone)]
pub enum Assigner {
    /// `HSET courier:order <courier> <order>` (the fallback until the orders API exists).
    Redis { url: String, keys: Keys },
}

/// How a customer watches an order.
#[derive(Debug, Clone)]
pub enum Viewer {
    /// Subscribes to `track/<order>` on the broker directly (no token).
    Broker { endpoint: MqttEndpoint },
}

impl Assigner {
    /// Assigns every `(courier, order)` pair.
    pub async fn assign(&self, pairs: &[(String, String)]) -> Result<(), SimError> {
        match self {
            Assigner::Redis { url, keys } => {
                if pairs.is_empty() {
                    return Ok(());
                }
                let mut c = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&keys.order);
                for (courier, order) in pairs {
                    cmd.arg(courier).arg(order);
                }
                let _: () = cmd.query_async(&mut c).await?;
                Ok(())
            }
        }
    }

    /// Ends the orders: removes the pairs this run wrote (only where they still hold its order).
    pub async fn finish(&self, pairs: &[(String, String)]) -> Result<(), SimError> {
        match self {
            Assigner::Redis { url, keys } => {
                if pairs.is_empty() {
                    return Ok(());
                }
                let mut c = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                let script = redis::Script::new(
                    "for i = 1, #ARGV, 2 do if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then redis.call('HDEL', KEYS[1], ARGV[i]) end end return 0",
                );
                let mut inv = script.key(&keys.order);
                for (courier, order) in pairs {
                    inv.arg(courier).arg(order);
                }
                let _: i64 = inv.invoke_async(&mut c).await?;
                Ok(())
            }
        }
    }
}

/// The `ts` of a `track/` payload.
pub fn track_ts(payload: &[u8]) -> Option<f64> {
    #[derive(serde::Deserialize)]
    struct Track {
        ts: f64,
    }
    serde_json::from_slice::<Track>(payload)
        .ok()
        .map(|t| t.ts)
        .filter(|t| t.is_finite())
}

/// Delay in microseconds between a point's phone time and its receipt; clocks of one machine,
/// and ts is rounded to the millisecond, so small negatives are rounding and count as 0.
pub fn delay_us(received: f64, ts: f64) -> u64 {
    ((received - ts) * 1e6).round().max(0.0) as u64
}

/// Watches one order until `stop`; `ready` is cancelled once the subscription is acknowledged.
pub async fn watch(
    viewer: Viewer,
    n: usize,
    order: String,
    stats: Arc<SimStats>,
    ready: CancellationToken,
    stop: CancellationToken,
) {
    match viewer {
        Viewer::Broker { endpoint } => {
            let o = courier_wire::mqtt::options(
                &endpoint,
                &courier_wire::mqtt::client_id("sim-watch", n),
                10,
            );
            let (client, mut el) = AsyncClient::new(o, 10);
            crate::links::no_delay(&mut el);
            let topic = courier_wire::track_topic(&order);
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => break,
                    ev = el.poll() => ev,
                };
                match ev {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = client.try_subscribe(topic.clone(), QoS::AtMostOnce);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => ready.cancel(),
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let now = unix_now();
                        match track_ts(&p.payload) {
                            Some(ts) => stats.record_delays(&[delay_us(now, ts)]),
                            None => {
                                stats.watcher_bad.fetch_add(1, Relaxed);
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "watcher connection failed; retrying");
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        }
                    }
                }
            }
            let _ = client.try_disconnect();
            let _ = tokio::time::timeout(Duration::from_millis(300), el.poll()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn track_payloads_give_their_ts() {
        let p = courier_wire::encode_track(24.7, 46.6, 1_764_460_800.123);
        assert_eq!(track_ts(&p), Some(1_764_460_800.123));
        assert_eq!(track_ts(b"{\"lat\":1}"), None);
        assert_eq!(track_ts(b"nope"), None);
    }

    #[test]
    fn delay_is_never_negative() {
        assert_eq!(delay_us(100.0015, 100.0), 1500);
        assert_eq!(delay_us(100.0, 100.0004), 0);
    }
}
