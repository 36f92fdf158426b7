//! The MQTT edge of the couriers: connections and their event-loop tasks.
//!
//! A courier's own connection carries his Last Will (`offline` on `couriers/<id>/status`).
//! Dropping its [`Link`] ends the event-loop task without a DISCONNECT, as a phone losing the
//! network does, so the broker publishes the Will. Connection attempts take a permit from a
//! semaphore: tens of thousands of phones ramp up instead of flooding the accept queue.

use crate::report::SimStats;
use courier_wire::MqttEndpoint;
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, Outgoing, Packet, QoS};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};
use tokio_util::task::TaskTracker;

pub use courier_wire::mqtt::no_delay;

/// One open (or opening) MQTT connection.
pub(crate) struct Link {
    pub client: AsyncClient,
    /// Dropped with the link: the event-loop task ends at once, without DISCONNECT.
    _kill: oneshot::Sender<()>,
}

/// What every connection of one simulator shares.
#[derive(Clone)]
pub(crate) struct Opener {
    /// Connection `n` goes to `endpoints[n % len]`.
    pub endpoints: Arc<Vec<MqttEndpoint>>,
    pub stats: Arc<SimStats>,
    pub permits: Arc<Semaphore>,
    pub tasks: TaskTracker,
    /// A courier's own connection logs in as him with this password (his device token), where
    /// the broker checks logins; `None`: the endpoint's credentials.
    pub courier_login: Option<CourierLogin>,
}

/// Gives the device token (MQTT password) of a courier id.
pub type CourierLogin = Arc<dyn Fn(&str) -> String + Send + Sync>;

impl Opener {
    /// The address connection `n` goes to.
    pub(crate) fn endpoint(&self, n: usize) -> &MqttEndpoint {
        &self.endpoints[n % self.endpoints.len()]
    }

    /// Opens connection number `n` (see [`Opener::endpoint`]); `i` only goes into its client
    /// id. `will` is the courier whose Last Will it carries. `capacity` bounds its request
    /// queue.
    pub(crate) fn open(&self, i: usize, n: usize, will: Option<&str>, capacity: usize) -> Link {
        let endpoint = self.endpoint(n);
        let mut o = courier_wire::mqtt::options(
            endpoint,
            &courier_wire::mqtt::client_id("sim", i),
            capacity,
        );
        // QoS 0 only: no packet ids to track, so a small inflight window keeps each of tens of
        // thousands of phone connections light.
        o.set_inflight(10);
        if let (Some(id), Some(login)) = (will, &self.courier_login) {
            o.set_credentials(id, login(id));
        }
        if let Some(id) = will {
            o.set_last_will(LastWill::new(
                courier_wire::status_topic(id),
                "offline",
                QoS::AtMostOnce,
                false,
            ));
        }
        let (client, mut eventloop) = AsyncClient::new(o, capacity);
        no_delay(&mut eventloop);
        let (kill, killed) = oneshot::channel();
        self.tasks.spawn(drive(
            eventloop,
            killed,
            self.stats.clone(),
            self.permits.clone(),
        ));
        Link {
            client,
            _kill: kill,
        }
    }
}

async fn drive(
    mut el: EventLoop,
    mut killed: oneshot::Receiver<()>,
    stats: Arc<SimStats>,
    permits: Arc<Semaphore>,
) {
    let mut up = false;
    let mut backoff = Duration::from_millis(250);
    loop {
        let permit = if up {
            None
        } else {
            tokio::select! {
                _ = &mut killed => break,
                p = permits.clone().acquire_owned() => p.ok(),
            }
        };
        let ev = tokio::select! {
            _ = &mut killed => break,
            ev = el.poll() => ev,
        };
        drop(permit);
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                up = true;
                backoff = Duration::from_millis(250);
                stats.connection_up();
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
            // Points go at QoS 0 (packet id 0), statuses at QoS 1: this is a point written.
            Ok(Event::Outgoing(Outgoing::Publish(0))) => {
                stats.sent.fetch_add(1, Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                if up {
                    up = false;
                    stats.connection_down();
                } else {
                    stats.connect_errors.fetch_add(1, Relaxed);
                }
                tracing::debug!(error = %e, "simulator connection failed; retrying");
                tokio::select! {
                    _ = &mut killed => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    if up {
        stats.connection_down();
    }
}
