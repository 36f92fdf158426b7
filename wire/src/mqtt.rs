//! MQTT client options every role uses (feature `mqtt`): the one place that turns an
//! [`MqttEndpoint`] into rumqttc options.

use crate::MqttEndpoint;
use rumqttc::MqttOptions;
use std::time::Duration;

/// Clean session, keep-alive 30 s, a generous incoming packet limit (an oversize payload is
/// then refused by validation and counted, not by dropping the connection), and a request queue
/// sized for the publishes this client makes.
pub fn options(endpoint: &MqttEndpoint, client_id: &str, request_capacity: usize) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, endpoint.host.clone(), endpoint.port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(1 << 20, 1 << 20)
        .set_request_channel_capacity(request_capacity.max(10));
    if let Some(user) = &endpoint.username {
        o.set_credentials(user.clone(), endpoint.password.clone().unwrap_or_default());
    }
    if endpoint.tls {
        install_crypto_provider();
        let tls = match &endpoint.ca_pem {
            Some(ca) => rumqttc::TlsConfiguration::Simple {
                ca: ca.clone(),
                alpn: None,
                client_auth: None,
            },
            // The system's trust store.
            None => rumqttc::TlsConfiguration::default(),
        };
        o.set_transport(rumqttc::Transport::tls_with_config(tls));
    }
    o
}

/// rustls needs one process-wide crypto provider; ring builds quickly and needs no C toolchain
/// beyond cc.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Points are small packets sent one at a time: without TCP_NODELAY, Nagle's algorithm holds
/// each behind the previous one's ACK and adds milliseconds of delay.
/// The next event of `eventloop`, running `on_tick` at each tick of `tick` meanwhile. A role's
/// loop must not put `poll()` and a timer side by side in one `select!`: a tick that fires
/// while rumqttc is connecting drops the half-made connection (its poll is not cancel-safe
/// then), so each start cost a reconnect and left the broker a reset link, logged at ERROR.
pub async fn poll_ticking(
    eventloop: &mut rumqttc::EventLoop,
    tick: &mut tokio::time::Interval,
    mut on_tick: impl FnMut(),
) -> Result<rumqttc::Event, rumqttc::ConnectionError> {
    let poll = eventloop.poll();
    tokio::pin!(poll);
    loop {
        tokio::select! {
            biased;
            ev = &mut poll => return ev,
            _ = tick.tick() => on_tick(),
        }
    }
}

pub fn no_delay(el: &mut rumqttc::EventLoop) {
    let mut n = el.network_options();
    n.set_tcp_nodelay(true);
    el.set_network_options(n);
}

/// A client id unique to this process and call: `<role>-<pid>-<n>-<random>`.
pub fn client_id(role: &str, n: usize) -> String {
    format!("{role}-{}-{n}-{:08x}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded per process and per instance: enough to keep ids apart.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}

/// What a subscriber's event loop should do with one polled event.
#[derive(Debug)]
pub enum Polled {
    /// A message for the role.
    Publish(rumqttc::Publish),
    /// The broker granted a subscription (readiness, tests).
    Subscribed,
    /// The connection failed: wait this long before polling again (rumqttc reconnects on the
    /// next poll).
    Failed(std::time::Duration),
    /// The broker took one of the UNSUBSCRIBEs of [`Subscriber::stop`]: nothing more will come
    /// for that filter.
    Unsubscribed,
    /// Nothing for the role.
    Other,
}

/// The control side every subscribing role shares: subscribe on each CONNACK (sessions are
/// clean, so after every reconnect), check SUBACKs, count connection changes and keep the
/// role's readiness flag. The role keeps only what it does with a publish.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

pub struct Subscriber {
    role: &'static str,
    client: rumqttc::AsyncClient,
    filters: Vec<String>,
    stopping: bool,
    /// The wait before the next connection attempt: 100 ms, doubling to 2 s, back to 100 ms
    /// once connected. Short at first because after a broker restart the publishers come back
    /// within a few hundred ms, and every point they send before this worker has subscribed
    /// again is lost (QoS 0, no session survives the restart).
    retry: std::cell::Cell<std::time::Duration>,
    connected: metrics::Counter,
    disconnected: metrics::Counter,
}

impl Subscriber {
    pub fn new(role: &'static str, client: rumqttc::AsyncClient, filters: Vec<String>) -> Self {
        use crate::metrics as m;
        Subscriber {
            role,
            client,
            filters,
            stopping: false,
            retry: std::cell::Cell::new(RETRY_FIRST),
            connected: metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "connected"),
            disconnected: metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "disconnected"),
        }
    }

    /// Handles one result of `EventLoop::poll`; `up` is the role's MQTT readiness flag.
    pub fn handle(
        &self,
        polled: Result<rumqttc::Event, rumqttc::ConnectionError>,
        up: &crate::health::Up,
    ) -> Polled {
        use rumqttc::{Event, Packet, QoS, SubscribeReasonCode};
        match polled {
            Ok(Event::Incoming(Packet::Publish(p))) => Polled::Publish(p),
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                self.connected.increment(1);
                self.retry.set(RETRY_FIRST);
                if !self.stopping {
                    tracing::info!(role = self.role, filters = ?self.filters, "mqtt connected; subscribing");
                    for f in &self.filters {
                        if let Err(e) = self.client.try_subscribe(f.clone(), QoS::AtMostOnce) {
                            tracing::error!(role = self.role, error = %e, "subscribe request refused");
                        }
                    }
                }
                Polled::Other
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, SubscribeReasonCode::Failure))
                {
                    tracing::error!(role = self.role, "broker refused a subscription");
                    Polled::Other
                } else {
                    up.set(true);
                    Polled::Subscribed
                }
            }
            Ok(Event::Incoming(Packet::UnsubAck(_))) => Polled::Unsubscribed,
            Ok(_) => Polled::Other,
            Err(e) => {
                up.set(false);
                self.disconnected.increment(1);
                let wait = self.retry.get();
                self.retry.set((wait * 2).min(RETRY_MAX));
                tracing::warn!(role = self.role, error = %e, retry_in = ?wait, "mqtt connection failed; retrying");
                Polled::Failed(wait)
            }
        }
    }

    /// Stops intake: unsubscribes, and does not subscribe again after a reconnect.
    pub fn stop(&mut self) {
        self.stopping = true;
        for f in &self.filters {
            let _ = self.client.try_unsubscribe(f.clone());
        }
    }

    /// Takes what is still arriving until the connection has been quiet for a moment, then
    /// sends DISCONNECT (and whatever is still queued, such as the last tracks) and reads on
    /// until the broker closes the connection, all within `within`; returns the messages that arrived meanwhile (sent before the broker took the
    /// unsubscribe), for the role to take or count: dropping them here lost them silently.
    pub async fn disconnect(
        self,
        eventloop: &mut rumqttc::EventLoop,
        within: Duration,
    ) -> Vec<rumqttc::Publish> {
        use rumqttc::{Event, Packet};
        const QUIET: Duration = Duration::from_millis(50);
        let mut late = Vec::new();
        // First what is already on its way (for half the time at most: a stream that never
        // pauses still gets its DISCONNECT): rumqttc's poll may pick the DISCONNECT request
        // before reading the socket, so the request goes in only once nothing arrives.
        let _ = tokio::time::timeout(within / 2, async {
            while let Ok(Ok(ev)) = tokio::time::timeout(QUIET, eventloop.poll()).await {
                if let Event::Incoming(Packet::Publish(p)) = ev {
                    late.push(p);
                }
            }
        })
        .await;
        // Then DISCONNECT, and the connection is left for the broker to close (as MQTT has it):
        // closing it first, with a publish the broker sent meanwhile still unread, resets it, and
        // rumqttd logs every reset link at ERROR.
        let _ = tokio::time::timeout(within / 2, async {
            let _ = self.client.try_disconnect();
            while let Ok(ev) = eventloop.poll().await {
                if let Event::Incoming(Packet::Publish(p)) = ev {
                    late.push(p);
                }
            }
        })
        .await;
        late
    }
}
