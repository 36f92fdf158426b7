//! The MQTT edge: the only door phones (and, later, viewers) reach. It terminates every untrusted
//! connection, checks the CONNECT (a courier's device token under his id), authorizes every
//! packet by the courier policy, and forwards what is allowed to the internal bus, which only the
//! pipeline's own workers reach.
//!
//! ```text
//! phone --MQTT 3.1.1/5 over TCP | TLS | WebSocket--> [source: listeners, handshakes]
//!   --> [session: CONNECT + every packet through policy; registry: one session per courier,
//!        rate bucket] --couriers/<own id>/loc|status, the edge's own Wills-->
//!   [bounded queue, full = dropped and counted] --> [sink] --> bus
//!   (`run`: rumqttd in-process link; `courier-pipeline edge`: a few MQTT connections to MQTT_URL)
//! ```
//!
//! Pure parts: `policy` (who may do what, the rate bucket), `codec` (packets, on rumqttc's
//! codecs), `config`. Edges: `source` (listeners), `session`, `transport`, `sink`.

pub mod codec;
pub mod config;
pub mod events;
pub mod policy;
mod registry;
mod session;
pub mod sink;
pub mod source;
pub mod transport;

pub use config::{EdgeConfig, EdgeSettings, TlsFiles};
use courier_wire::ConfigError;
pub use events::{Stats, Via};
pub use policy::Refusal;
pub use sink::Queue;
pub use source::{Door, DoorRefusal, DoorSettings, PendingSlot, Policy};

use bytes::Bytes;
use courier_auth::Verifier;
use courier_wire::MqttEndpoint;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One message for the bus: a courier's point or status, or a Will the edge publishes for him.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("edge cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("edge TLS: {0}")]
    Tls(String),
    #[error("edge has no listener: set EDGE_LISTEN, EDGE_TLS_LISTEN or EDGE_WS_LISTEN")]
    NoListener,
    #[error("edge has no bus: its queue was neither taken nor given an MQTT endpoint")]
    NoBus,
}

/// The edge of one process, before it binds.
pub struct Edge {
    pub settings: EdgeSettings,
    /// Checks the couriers' device tokens.
    pub keys: Verifier,
    /// Shared with whoever reports progress (tests, benchmarks, status lines).
    pub stats: Arc<Stats>,
}

/// An edge whose listeners are bound (ports taken), ready to run.
pub struct Bound {
    sh: Arc<session::Shared>,
    door: Door,
    queue: Option<Queue>,
}

impl Edge {
    /// Binds every listener now, so that a port in use (or a bad certificate) is a start-up
    /// error, and raises the open-file limit (each phone is a socket).
    pub fn bind(self) -> Result<Bound, EdgeError> {
        let s = &self.settings;
        if s.tcp.is_empty() && s.tls.is_empty() && s.ws.is_empty() {
            return Err(EdgeError::NoListener);
        }
        let nofile = courier_wire::limits::raise_nofile(0);
        if nofile < (s.max_connections + s.max_pending) as u64 {
            tracing::info!(
                nofile,
                max_connections = s.max_connections,
                "open-file limit is below edge.max_connections: the limit decides (run more edge processes on the port)"
            );
        }
        let door = Door::bind(
            &s.tcp,
            &s.tls,
            s.tls_files.as_ref(),
            &s.ws,
            DoorSettings {
                max_pending: s.max_pending,
                connect_timeout: s.connect_timeout,
                max_packet_bytes: s.max_packet_bytes,
                reuse_port: s.reuse_port,
            },
        )?;
        let (tx, rx) = mpsc::channel(s.queue_capacity);
        let sh = Arc::new(session::Shared {
            keys: self.keys,
            settings: self.settings,
            bus: tx,
            registry: Default::default(),
            metrics: events::Metrics::new(),
            stats: self.stats,
            connected: AtomicUsize::new(0),
            next_conn: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        });
        Ok(Bound {
            sh,
            door,
            queue: Some(Queue {
                rx,
                depth: metrics::gauge!(courier_wire::metrics::EDGE_QUEUE_DEPTH),
            }),
        })
    }
}

impl Bound {
    /// The addresses bound (port 0 resolved), by transport.
    pub fn local_addrs(&self) -> Vec<(Via, SocketAddr)> {
        self.door.local_addrs()
    }

    /// The queue to the bus, for a caller that drains it itself (the embedded broker's link).
    /// Without it, [`Bound::run`] forwards over MQTT.
    pub fn take_queue(&mut self) -> Option<Queue> {
        self.queue.take()
    }

    /// Serves phones until `shutdown`; then closes every session (no Wills: the phones
    /// reconnect elsewhere), lets the queue drain to the bus (at `bus`, unless the queue was
    /// taken) and returns.
    pub async fn run(
        mut self,
        bus: Option<MqttEndpoint>,
        shutdown: CancellationToken,
    ) -> Result<(), EdgeError> {
        let forwarder = match (self.queue.take(), bus) {
            (Some(q), Some(endpoint)) => {
                let (n, stats) = (self.sh.settings.bus_connections, self.sh.stats.clone());
                Some(tokio::spawn(sink::mqtt(endpoint, n, q, stats)))
            }
            (Some(_), None) => return Err(EdgeError::NoBus),
            (None, _) => {
                self.sh.stats.bus_up.set(true);
                None
            }
        };
        let sessions = self.door.run(self.sh.clone(), shutdown).await;
        // Sessions that logged in wait on their kick only (not on `shutdown`): tell them.
        self.sh.registry.stop_all();
        if tokio::time::timeout(Duration::from_secs(2), sessions.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = sessions.len(),
                "edge sessions still closing at shutdown"
            );
        }
        // The sessions' ends are queued; dropping the last sender lets the forwarder finish.
        drop(self.sh);
        if let Some(f) = forwarder {
            let _ = tokio::time::timeout(Duration::from_secs(5), f).await;
        }
        Ok(())
    }
}
