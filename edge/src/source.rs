//! The door every untrusted client comes through: listeners (TCP, TLS, WebSocket), their accept
//! loops, the handshakes and the bound on connections not logged in yet. What a client may do
//! once its transport is up is a [`Policy`]: couriers' phones (this crate's session) or
//! customers' viewers (the fanout gateway), on the same machinery.
//!
//! Handshakes (TLS, WebSocket) run in each connection's own task under the connect deadline, never
//! in the accept loop, so one idle TCP connection cannot delay anyone else's login. Each
//! transport spawns its own task type: a plain TCP session does not carry a TLS session's (much
//! larger) state.

use crate::events::Via;
use crate::transport::{check_upgrade, ws_config, Stream, Tcp, Transport, Ws};
use crate::{EdgeError, TlsFiles};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the door turned a connection away before its policy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorRefusal {
    /// `max_pending` connections are not logged in yet.
    Full,
    /// The TLS or WebSocket handshake failed (`timed_out`: it did not finish by the deadline).
    Handshake { via: Via, timed_out: bool },
}

/// What one kind of client does once its transport is up.
pub trait Policy: Send + Sync + 'static {
    /// Serves one connection. `slot` counts it as not logged in: drop it once the client is.
    /// `deadline` bounds the login (the handshake is done already).
    fn serve<T: Transport + 'static>(
        self: Arc<Self>,
        io: T,
        via: Via,
        slot: PendingSlot,
        deadline: Instant,
        shutdown: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static;

    /// Counts a connection the door refused.
    fn refused_at_door(&self, why: DoorRefusal);
}

/// Settings of a door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorSettings {
    /// Connections accepted and not logged in yet, at most.
    pub max_pending: usize,
    /// From accept to an authorized CONNECT, handshakes included.
    pub connect_timeout: Duration,
    /// Largest MQTT packet (WebSocket frames are bounded by twice this).
    pub max_packet_bytes: usize,
    /// Bind with SO_REUSEPORT (several processes on one port).
    pub reuse_port: bool,
}

/// What the listeners of one door share.
struct Gate {
    pending: AtomicUsize,
    settings: DoorSettings,
}

/// A connection accepted and not logged in yet; counted while it lives.
pub struct PendingSlot(Arc<Gate>);

impl PendingSlot {
    /// A slot of a door of its own (unit tests of a policy's session).
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        PendingSlot(Arc::new(Gate {
            pending: AtomicUsize::new(1),
            settings: DoorSettings {
                max_pending: 1,
                connect_timeout: Duration::from_secs(1),
                max_packet_bytes: 4096,
                reuse_port: false,
            },
        }))
    }

    fn take(gate: &Arc<Gate>) -> Option<Self> {
        if gate.pending.fetch_add(1, Relaxed) >= gate.settings.max_pending {
            gate.pending.fetch_sub(1, Relaxed);
            return None;
        }
        Some(PendingSlot(gate.clone()))
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Relaxed);
    }
}

/// What a listener speaks.
#[derive(Clone)]
enum Kind {
    Tcp,
    Tls(TlsAcceptor),
    Ws,
}

/// Bound listeners, ready to accept for a [`Policy`].
pub struct Door {
    listeners: Vec<(TcpListener, Kind, Via)>,
    gate: Arc<Gate>,
}

impl Door {
    /// Binds every listener now, so that a port in use (or a bad certificate) is a start-up
    /// error.
    pub fn bind(
        tcp: &[SocketAddr],
        tls: &[SocketAddr],
        tls_files: Option<&TlsFiles>,
        ws: &[SocketAddr],
        settings: DoorSettings,
    ) -> Result<Door, EdgeError> {
        let mut listeners = Vec::new();
        for &a in tcp {
            listeners.push((bind(a, settings.reuse_port)?, Kind::Tcp, Via::Tcp));
        }
        if !tls.is_empty() {
            let files = tls_files.ok_or_else(|| {
                EdgeError::Tls("a TLS listener needs a certificate and a key".into())
            })?;
            let acceptor = tls_acceptor(files)?;
            for &a in tls {
                listeners.push((
                    bind(a, settings.reuse_port)?,
                    Kind::Tls(acceptor.clone()),
                    Via::Tls,
                ));
            }
        }
        for &a in ws {
            listeners.push((bind(a, settings.reuse_port)?, Kind::Ws, Via::Ws));
        }
        Ok(Door::new(listeners, settings))
    }

    /// A door on a WebSocket listener the caller bound already.
    pub fn websocket(listener: TcpListener, settings: DoorSettings) -> Door {
        Door::new(vec![(listener, Kind::Ws, Via::Ws)], settings)
    }

    fn new(listeners: Vec<(TcpListener, Kind, Via)>, settings: DoorSettings) -> Door {
        Door {
            listeners,
            gate: Arc::new(Gate {
                pending: AtomicUsize::new(0),
                settings,
            }),
        }
    }

    /// The addresses bound (port 0 resolved), by transport.
    pub fn local_addrs(&self) -> Vec<(Via, SocketAddr)> {
        self.listeners
            .iter()
            .filter_map(|(l, _, via)| Some((*via, l.local_addr().ok()?)))
            .collect()
    }

    /// Accepts for `policy` until `shutdown`; returns the tracker of the connections' tasks
    /// (closed: the caller waits for them, after telling them to end where its policy needs it).
    pub async fn run<P: Policy>(self, policy: Arc<P>, shutdown: CancellationToken) -> TaskTracker {
        let sessions = TaskTracker::new();
        let accepts = TaskTracker::new();
        for (l, kind, via) in self.listeners {
            accepts.spawn(accept(
                policy.clone(),
                self.gate.clone(),
                l,
                kind,
                via,
                sessions.clone(),
                shutdown.clone(),
            ));
        }
        accepts.close();
        accepts.wait().await;
        sessions.close();
        sessions
    }
}

/// Binds `addr` now, with SO_REUSEPORT when asked so that several processes share the port.
fn bind(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, EdgeError> {
    let listen = |source| EdgeError::Listen { addr, source };
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(listen)?;
    s.set_reuse_address(true).map_err(listen)?;
    if reuse_port {
        s.set_reuse_port(true).map_err(listen)?;
    }
    // Accepted sockets inherit it (Linux): acknowledgements are small and must not wait for Nagle.
    s.set_tcp_nodelay(true).map_err(listen)?;
    s.set_nonblocking(true).map_err(listen)?;
    s.bind(&addr.into()).map_err(listen)?;
    // A deep backlog: after a restart every phone reconnects at once.
    s.listen(8192).map_err(listen)?;
    TcpListener::from_std(s.into()).map_err(listen)
}

/// rustls server configuration from PEM files (ring provider, no client certificates).
fn tls_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, EdgeError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls = |what: &str, e: &dyn std::fmt::Display| EdgeError::Tls(format!("{what}: {e}"));
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| tls(&files.cert.display().to_string(), &e))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| tls(&files.key.display().to_string(), &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls("protocol versions", &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls("certificate", &e))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts until `shutdown`; every connection is a task on `tasks`.
async fn accept<P: Policy>(
    policy: Arc<P>,
    gate: Arc<Gate>,
    listener: TcpListener,
    kind: Kind,
    via: Via,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors or a reset during accept: the listener itself is
                    // fine; slow down instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        };
        let Some(slot) = PendingSlot::take(&gate) else {
            policy.refused_at_door(DoorRefusal::Full);
            continue;
        };
        let deadline = Instant::now() + gate.settings.connect_timeout;
        let (p, stop) = (policy.clone(), shutdown.clone());
        let failed =
            move |p: &P, timed_out| p.refused_at_door(DoorRefusal::Handshake { via, timed_out });
        match &kind {
            Kind::Tcp => {
                tasks.spawn(p.serve(Tcp(stream), via, slot, deadline, stop));
            }
            Kind::Tls(acceptor) => {
                let acceptor = acceptor.clone();
                tasks.spawn(async move {
                    match timeout_at(deadline, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => p.serve(Stream(tls), via, slot, deadline, stop).await,
                        Ok(Err(_)) => failed(&p, false),
                        Err(_) => failed(&p, true),
                    }
                });
            }
            Kind::Ws => {
                let max = gate.settings.max_packet_bytes;
                tasks.spawn(async move {
                    let upgrade = tokio_tungstenite::accept_hdr_async_with_config(
                        stream,
                        check_upgrade,
                        Some(ws_config(max)),
                    );
                    match timeout_at(deadline, upgrade).await {
                        Ok(Ok(ws)) => p.serve(Ws::new(ws), via, slot, deadline, stop).await,
                        Ok(Err(_)) => failed(&p, false),
                        Err(_) => failed(&p, true),
                    }
                });
            }
        }
    }
}
