//! Customers watching their orders: how orders are assigned to couriers, and how a customer
//! sees the courier, measuring the phone-to-viewer delay (receive time minus the point's ts).
//!
//! Two paths. The real customer path: the orders API assigns each order (service key), hands
//! out a tracking token per order with the gateway's WebSocket URL, and the watcher connects
//! to the viewer gateway (MQTT over WebSocket, the token as password) and subscribes to
//! `track/<order>`; at the end the run delivers its orders (`POST .../events`). The fallback,
//! for a pipeline without fanout: `HSET courier:order` in Redis and `track/<order>` on the
//! broker, the pairs removed at the end.

use crate::orders::{OrdersApi, Ticket};
use crate::report::SimStats;
use crate::SimError;
use courier_wire::{clock::unix_now, Keys, MqttEndpoint, RedisConn, RedisOptions, RedisTarget};
use rumqttc::{AsyncClient, Event, EventLoop, Packet, QoS, SubscribeReasonCode};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Orders API calls in flight at once (assign, deliver).
const API_IN_FLIGHT: usize = 16;
/// Pause before a watcher connects again after its connection failed.
const RETRY: Duration = Duration::from_millis(500);

/// How orders get their courier.
#[derive(Debug, Clone)]
pub enum Assigner {
    /// `HSET courier:order <courier> <order>` (the fallback for a pipeline without fanout).
    Redis {
        redis: RedisTarget,
        /// Boxed: the key names are the large part, and most runs use the API.
        keys: Box<Keys>,
    },
    /// `POST {base_url}/orders/{order}/assign` with `Authorization: Bearer <service_key>`;
    /// the run ends its orders with a `delivered` event (with an `Idempotency-Key`).
    Api {
        base_url: String,
        service_key: String,
    },
}

/// How a customer watches an order.
#[derive(Debug, Clone)]
pub enum Viewer {
    /// Subscribes to `track/<order>` on the broker directly (no token).
    Broker { endpoint: MqttEndpoint },
    /// Through the viewer gateway: each watcher gets its order's tracking token from the
    /// orders API (so it needs [`Assigner::Api`]) and connects to the `ws_url` of that answer,
    /// the token as password, as a customer's app does. Only `ws://` URLs.
    Gateway,
}

impl Assigner {
    /// `redis` or `orders_api`, for the progress line and the report.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Assigner::Redis { .. } => "redis",
            Assigner::Api { .. } => "orders_api",
        }
    }

    fn api(&self) -> Result<OrdersApi, SimError> {
        match self {
            Assigner::Api {
                base_url,
                service_key,
            } => OrdersApi::new(base_url, service_key),
            Assigner::Redis { .. } => Err(SimError::Config(
                "tracking tokens come from the orders API: the gateway viewer needs Assigner::Api"
                    .into(),
            )),
        }
    }

    /// Checks that this assigner and `viewer` can work together (before anything starts).
    pub fn check(&self, viewer: &Viewer) -> Result<(), SimError> {
        if let Assigner::Api { .. } = self {
            self.api()?;
        }
        if let Viewer::Gateway = viewer {
            self.api()?;
        }
        Ok(())
    }

    /// Assigns every `(courier, order)` pair.
    pub(crate) async fn assign(&self, pairs: &[(String, String)]) -> Result<(), SimError> {
        if pairs.is_empty() {
            return Ok(());
        }
        match self {
            Assigner::Redis { redis, keys } => {
                let mut c = RedisConn::connect(redis, &RedisOptions::default()).await?;
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&keys.order);
                for (courier, order) in pairs {
                    cmd.arg(courier).arg(order);
                }
                let _: () = cmd.query_async(&mut c).await?;
                Ok(())
            }
            Assigner::Api { .. } => {
                let api = self.api()?;
                let (_, failed) = each(pairs, move |courier, order| {
                    let api = api.clone();
                    async move { api.assign(&order, &courier).await }
                })
                .await;
                match failed {
                    Some((n, e)) => {
                        tracing::error!(failed = n, of = pairs.len(), "orders API: assign failed");
                        Err(e)
                    }
                    None => Ok(()),
                }
            }
        }
    }

    /// Ends the orders: the API delivers them (failures are logged); Redis removes the pairs
    /// this run wrote (only where they still hold its order). Returns how many were ended.
    pub(crate) async fn finish(&self, pairs: &[(String, String)]) -> Result<usize, SimError> {
        if pairs.is_empty() {
            return Ok(0);
        }
        match self {
            Assigner::Redis { redis, keys } => {
                let mut c = RedisConn::connect(redis, &RedisOptions::default()).await?;
                let script = redis::Script::new(
                    "local n = 0 for i = 1, #ARGV, 2 do if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then redis.call('HDEL', KEYS[1], ARGV[i]) n = n + 1 end end return n",
                );
                let mut inv = script.key(&keys.order);
                for (courier, order) in pairs {
                    inv.arg(courier).arg(order);
                }
                let n: i64 = inv.invoke_async(&mut c).await?;
                Ok(n as usize)
            }
            Assigner::Api { .. } => {
                let api = self.api()?;
                let (ended, failed) = each(pairs, move |_, order| {
                    let api = api.clone();
                    async move { api.delivered(&order).await }
                })
                .await;
                if let Some((n, e)) = failed {
                    // The report shows orders_ended below orders.
                    tracing::warn!(failed = n, of = pairs.len(), error = %e, "orders API: some orders could not be delivered");
                }
                Ok(ended)
            }
        }
    }
}

impl Viewer {
    /// `broker` or `gateway`, for the progress line and the report.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Viewer::Broker { .. } => "broker",
            Viewer::Gateway => "gateway",
        }
    }
}

/// Runs `call(courier, order)` for every pair, [`API_IN_FLIGHT`] at a time. Returns how many
/// succeeded, and how many failed with the first error.
async fn each<F, Fut>(pairs: &[(String, String)], call: F) -> (usize, Option<(usize, SimError)>)
where
    F: Fn(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), SimError>> + Send + 'static,
{
    let mut set = JoinSet::new();
    let mut todo = pairs.iter();
    let (mut ok, mut failed, mut first) = (0, 0, None);
    loop {
        while set.len() < API_IN_FLIGHT {
            match todo.next() {
                Some((courier, order)) => {
                    set.spawn(call(courier.clone(), order.clone()));
                }
                None => break,
            }
        }
        let r = match set.join_next().await {
            None => break,
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(SimError::Config(format!("orders API task failed: {e}"))),
        };
        match r {
            Ok(()) => ok += 1,
            Err(e) => {
                failed += 1;
                first.get_or_insert(e);
            }
        }
    }
    (ok, first.map(|e| (failed, e)))
}

/// The `ts` of a `track/` payload.
pub(crate) fn track_ts(payload: &[u8]) -> Option<f64> {
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
pub(crate) fn delay_us(received: f64, ts: f64) -> u64 {
    ((received - ts) * 1e6).round().max(0.0) as u64
}

/// Watches one order until `stop`; `ready` is cancelled once the subscription is granted.
pub(crate) async fn watch(
    viewer: Viewer,
    assigner: Assigner,
    n: usize,
    order: String,
    stats: Arc<SimStats>,
    ready: CancellationToken,
    stop: CancellationToken,
) {
    let topic = courier_wire::track_topic(&order);
    match viewer {
        Viewer::Broker { endpoint } => {
            let o = courier_wire::mqtt::options(
                &endpoint,
                &courier_wire::mqtt::client_id("sim-watch", n),
                10,
            );
            let (client, mut el) = AsyncClient::new(o, 10);
            crate::links::no_delay(&mut el);
            // The event loop connects again by itself on the next poll.
            while !receive(&client, &mut el, &topic, false, &stats, &ready, &stop).await {
                if pause(&stop).await {
                    break;
                }
            }
            let _ = client.try_disconnect();
            let _ = tokio::time::timeout(Duration::from_millis(300), el.poll()).await;
        }
        Viewer::Gateway => {
            let api = match assigner.api() {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, "gateway watcher without the orders API");
                    return;
                }
            };
            // A fresh token for every connection: one that failed may have expired.
            loop {
                let ticket = tokio::select! {
                    _ = stop.cancelled() => break,
                    t = api.tracking_token(&order) => t,
                };
                let ticket = match ticket.and_then(|t| gateway_options(t, n)) {
                    Ok(t) => t,
                    Err(e) => {
                        stats.watcher_errors.fetch_add(1, Relaxed);
                        tracing::warn!(error = %e, "watcher got no tracking token; retrying");
                        if pause(&stop).await {
                            break;
                        }
                        continue;
                    }
                };
                let (topic, o) = ticket;
                let (client, mut el) = AsyncClient::new(o, 10);
                crate::links::no_delay(&mut el);
                let stopped = receive(&client, &mut el, &topic, true, &stats, &ready, &stop).await;
                if stopped {
                    let _ = client.try_disconnect();
                    let _ = tokio::time::timeout(Duration::from_millis(300), el.poll()).await;
                    break;
                }
                if pause(&stop).await {
                    break;
                }
            }
        }
    }
}

/// MQTT options for the gateway from a tracking-token answer: (topic, options).
fn gateway_options(t: Ticket, n: usize) -> Result<(String, rumqttc::MqttOptions), SimError> {
    if !t.ws_url.starts_with("ws://") {
        return Err(SimError::Config(format!(
            "gateway URL {:?}: only ws:// is supported by the simulator",
            t.ws_url
        )));
    }
    let mut o = rumqttc::MqttOptions::new(
        courier_wire::mqtt::client_id("sim-view", n),
        t.ws_url,
        // Ignored for WebSocket: host and port come from the URL.
        80,
    );
    o.set_transport(rumqttc::Transport::Ws)
        .set_keep_alive(Duration::from_secs(30))
        .set_credentials("customer", t.token);
    Ok((t.topic, o))
}

/// Waits [`RETRY`]; true when `stop` fired meanwhile.
async fn pause(stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(RETRY) => false,
    }
}

/// Subscribes to `topic` on every CONNACK and measures each point received, until `stop`
/// (true) or a connection error (false). With `initial` the first point after a SUBSCRIBE may
/// be the gateway's last known position of the courier (sent at once, not live): when its ts
/// precedes the SUBSCRIBE it is counted apart, not as a delay.
async fn receive(
    client: &AsyncClient,
    el: &mut EventLoop,
    topic: &str,
    initial: bool,
    stats: &SimStats,
    ready: &CancellationToken,
    stop: &CancellationToken,
) -> bool {
    let mut subscribed_at: Option<f64> = None;
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return true,
            ev = el.poll() => ev,
        };
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                let _ = client.try_subscribe(topic.to_string(), QoS::AtMostOnce);
                subscribed_at = initial.then(unix_now);
            }
            Ok(Event::Incoming(Packet::SubAck(a))) => {
                if a.return_codes
                    .iter()
                    .all(|c| matches!(c, SubscribeReasonCode::Success(_)))
                {
                    ready.cancel();
                } else {
                    stats.watcher_errors.fetch_add(1, Relaxed);
                    tracing::warn!("watcher subscription refused");
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let now = unix_now();
                match track_ts(&p.payload) {
                    Some(ts) if subscribed_at.take().is_some_and(|at| ts < at) => {
                        stats.watcher_initial.fetch_add(1, Relaxed);
                    }
                    Some(ts) => stats.record_delays(&[delay_us(now, ts)]),
                    None => {
                        stats.watcher_bad.fetch_add(1, Relaxed);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                stats.watcher_errors.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, "watcher connection failed; retrying");
                return false;
            }
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
    fn gateway_tickets_become_websocket_options() {
        let t = Ticket {
            token: "tok".into(),
            topic: "track/o1".into(),
            ws_url: "ws://127.0.0.1:9/mqtt".into(),
        };
        let (topic, o) = gateway_options(t.clone(), 3).unwrap();
        assert_eq!(topic, "track/o1");
        assert_eq!(o.broker_address().0, "ws://127.0.0.1:9/mqtt");
        assert!(matches!(o.transport(), rumqttc::Transport::Ws));
        assert_eq!(o.credentials().map(|c| c.password), Some("tok".to_string()));
        let wss = Ticket {
            ws_url: "wss://h/mqtt".into(),
            ..t
        };
        assert!(gateway_options(wss, 3).is_err());
    }

    #[test]
    fn the_gateway_needs_the_orders_api() {
        let redis = Assigner::Redis {
            redis: RedisTarget::single("redis://127.0.0.1/"),
            keys: Box::new(Keys::with_prefix("")),
        };
        assert!(redis.check(&Viewer::Gateway).is_err());
        let api = Assigner::Api {
            base_url: "http://127.0.0.1:8080".into(),
            service_key: "k".into(),
        };
        assert!(api.check(&Viewer::Gateway).is_ok());
        let bad = Assigner::Api {
            base_url: "127.0.0.1:8080".into(),
            service_key: "k".into(),
        };
        let endpoint = MqttEndpoint::parse("mqtt://127.0.0.1:1883").unwrap();
        assert!(bad.check(&Viewer::Broker { endpoint }).is_err());
        assert_eq!(
            (api.label(), Viewer::Gateway.label()),
            ("orders_api", "gateway")
        );
    }

    #[test]
    fn delay_is_never_negative() {
        assert_eq!(delay_us(100.0015, 100.0), 1500);
        assert_eq!(delay_us(100.0, 100.0004), 0);
    }
}
