//! The embedded MQTT broker (rumqttd) of `courier-pipeline run` and `courier-pipeline broker`.
//! It runs on its own threads; its alerts are turned into counters, since rumqttd reports the
//! loss of QoS 0 messages to slow subscribers only as `CursorJump` alerts. rumqttd does not set
//! TCP_NODELAY on the sockets it accepts; [`start`] sets it on rumqttd's listeners, which Linux
//! copies to every accepted socket (see [`no_delay_on_listeners`]).

use courier_wire::metrics as m;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The broker configuration shipped in `broker-config/rumqttd.toml`.
pub const DEFAULT_CONFIG: &str = include_str!("../broker-config/rumqttd.toml");

/// Cursor jumps seen since start (for the status line).
pub static CURSOR_JUMPS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("broker config {path}: {reason}")]
    Config { path: String, reason: String },
    #[error("embedded broker cannot listen on {addr}: {reason}")]
    Listen { addr: SocketAddr, reason: String },
    #[error("embedded broker: {0}")]
    Start(String),
}

/// Reads a rumqttd configuration (the shipped one when `path` is `None`) and sets the address
/// of its first v4 listener.
pub fn load_config(
    path: Option<&Path>,
    listen: SocketAddr,
) -> Result<rumqttd::Config, BrokerError> {
    let (name, text) = match path {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| BrokerError::Config {
                path: p.display().to_string(),
                reason: e.to_string(),
            })?,
        ),
        None => ("(built-in)".to_string(), DEFAULT_CONFIG.to_string()),
    };
    let mut config: rumqttd::Config = toml::from_str(&text).map_err(|e| BrokerError::Config {
        path: name.clone(),
        reason: e.to_string(),
    })?;
    let v4 = config.v4.as_mut().and_then(|v4| {
        let mut keys: Vec<_> = v4.keys().cloned().collect();
        keys.sort();
        keys.first().cloned().and_then(|k| v4.get_mut(&k))
    });
    match v4 {
        Some(server) => server.listen = listen,
        None => {
            return Err(BrokerError::Config {
                path: name,
                reason: "no [v4.*] listener".into(),
            })
        }
    }
    Ok(config)
}

/// A TLS listener of the embedded broker.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsListener {
    pub listen: SocketAddr,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// Adds a TLS listener (a copy of the plain one's settings) and, with the bus audience's keys, the login
/// check on every listener: the pipeline's workers with a bus token under their own role, nobody else. Phones log
/// in at the edge: rumqttd cannot authorize a packet after CONNECT, so a courier on the bus
/// could read every courier's points. rumqttd closes a refused connection without a CONNACK code.
pub fn secure(
    config: &mut rumqttd::Config,
    tls: Option<&TlsListener>,
    auth: Option<courier_auth::Verifier>,
) -> Result<(), BrokerError> {
    let servers = config.v4.get_or_insert_with(Default::default);
    if let Some(tls) = tls {
        for f in [&tls.cert, &tls.key] {
            if !f.is_file() {
                return Err(BrokerError::Config {
                    path: f.display().to_string(),
                    reason: "TLS file not found".into(),
                });
            }
        }
        let mut keys: Vec<_> = servers.keys().cloned().collect();
        keys.sort();
        let mut server = keys
            .first()
            .and_then(|k| servers.get(k))
            .cloned()
            .ok_or_else(|| BrokerError::Start("no [v4.*] listener to copy for TLS".into()))?;
        server.name = "v4-tls".into();
        server.listen = tls.listen;
        server.tls = Some(rumqttd::TlsConfig::Rustls {
            capath: None,
            certpath: tls.cert.display().to_string(),
            keypath: tls.key.display().to_string(),
        });
        servers.insert("tls".into(), server);
    }
    if let Some(keys) = auth {
        let keys = Arc::new(keys);
        let all = [config.v4.as_mut(), config.v5.as_mut(), config.ws.as_mut()];
        for server in all.into_iter().flatten().flat_map(|m| m.values_mut()) {
            let keys = keys.clone();
            server.set_auth_handler(move |_client_id, user: String, pass: String| {
                let now = courier_wire::clock::unix_now() as u64;
                let result = courier_auth::bus_login(&keys, &user, &pass, now);
                let admitted = result.is_ok();
                let label = if admitted { "service" } else { "refused" };
                metrics::counter!(m::BROKER_LOGINS, "result" => label).increment(1);
                match &result {
                    // Any other audience's token is signed with a key the bus does not hold.
                    Err(courier_auth::LoginError::Token(courier_auth::TokenError::UnknownKey)) => {
                        tracing::info!(
                            username = %user,
                            "bus login refused: not a bus token (couriers log in at the edge, EDGE_LISTEN)"
                        )
                    }
                    Err(e) => tracing::info!(username = %user, reason = %e, "bus login refused"),
                    Ok(_) => {}
                }
                std::future::ready(admitted)
            });
        }
    }
    Ok(())
}

/// Every address the broker's listeners use.
fn listen_addrs(config: &rumqttd::Config) -> Vec<SocketAddr> {
    [config.v4.as_ref(), config.v5.as_ref(), config.ws.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|m| m.values().map(|s| s.listen))
        .collect()
}

/// Starts the broker and waits until every listener accepts connections.
pub fn start(config: rumqttd::Config, listen: SocketAddr) -> Result<(), BrokerError> {
    start_inner(config, listen, false).map(|_| ())
}

/// Starts the broker with an in-process link for the edge of this process, and a thread that
/// hands the edge's queue to it: the phones' points reach rumqttd's router with no TCP hop and
/// no per-phone state in rumqttd.
pub fn start_with_edge(
    config: rumqttd::Config,
    listen: SocketAddr,
    queue: edge::Queue,
) -> Result<(), BrokerError> {
    let (tx, rx) = start_inner(config, listen, true)?.expect("asked for a link");
    forward_edge(queue, tx, rx)
}

/// How many messages one router wake-up carries at most.
const LINK_BATCH: usize = 512;

fn forward_edge(
    mut queue: edge::Queue,
    mut tx: rumqttd::local::LinkTx,
    mut rx: rumqttd::local::LinkRx,
) -> Result<(), BrokerError> {
    use rumqttd::protocol::{Packet, Publish};
    // The router answers on the link (acks, none for QoS 0); keep it drained.
    std::thread::Builder::new()
        .name("edge-link-rx".into())
        .spawn(move || while rx.recv().is_ok() {})
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    std::thread::Builder::new()
        .name("edge-link".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(LINK_BATCH);
            while queue.blocking_recv_many(&mut batch, LINK_BATCH) > 0 {
                // All but the last go straight into the link's buffer; the last one's publish
                // wakes the router once for the whole batch.
                let last = batch.pop().expect("at least one");
                {
                    let mut buf = tx.buffer();
                    for m in batch.drain(..) {
                        let topic = bytes::Bytes::from(m.topic);
                        buf.push_back(Packet::Publish(Publish::new(topic, m.payload, false), None));
                    }
                }
                if let Err(e) = tx.publish(last.topic, last.payload) {
                    tracing::error!(error = %e, "embedded broker link closed; edge forwarding stops");
                    return;
                }
            }
        })
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    Ok(())
}

type Link = (rumqttd::local::LinkTx, rumqttd::local::LinkRx);

fn start_inner(
    config: rumqttd::Config,
    listen: SocketAddr,
    edge_link: bool,
) -> Result<Option<Link>, BrokerError> {
    let mut addrs = listen_addrs(&config);
    if !addrs.contains(&listen) {
        addrs.push(listen);
    }
    // rumqttd only logs a failed bind from its own thread; find out here, with a clear error.
    for addr in &addrs {
        TcpListener::bind(addr).map_err(|e| BrokerError::Listen {
            addr: *addr,
            reason: e.to_string(),
        })?;
    }
    let mut broker = rumqttd::Broker::new(config);
    let link = if edge_link {
        Some(
            broker
                .link("edge-in-process")
                .map_err(|e| BrokerError::Start(e.to_string()))?,
        )
    } else {
        None
    };
    let alerts = broker
        .alerts()
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    std::thread::Builder::new()
        .name("broker-alerts".into())
        .spawn(move || {
            let jumps = metrics::counter!(m::BROKER_CURSOR_JUMPS);
            let other = metrics::counter!(m::BROKER_ALERTS_OTHER);
            while let Ok(batch) = alerts.router_rx.recv() {
                for alert in batch {
                    if alert.kind.name() == "cursor_jump" {
                        jumps.increment(1);
                        CURSOR_JUMPS.fetch_add(1, Relaxed);
                    } else {
                        other.increment(1);
                    }
                }
            }
        })
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    std::thread::Builder::new()
        .name("broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded broker stopped");
            }
        })
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    // Ready once rumqttd's thread holds a socket on each address, found among this process's
    // descriptors: neither a connection (rumqttd would log it as aborted) nor a probing bind
    // (which, taken at the moment rumqttd binds, made its listener fail and this wait time out).
    let deadline = Instant::now() + Duration::from_secs(15);
    for &addr in &addrs {
        while !on_listeners(&[addr.port()], |_| true).is_ok_and(|n| n > 0) {
            if Instant::now() > deadline {
                return Err(BrokerError::Listen {
                    addr,
                    reason: "not accepting connections after 15s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let ports: Vec<u16> = addrs.iter().map(|a| a.port()).collect();
    match no_delay_on_listeners(&ports) {
        Ok(n) if n >= ports.len() => tracing::debug!(sockets = n, "TCP_NODELAY set on broker listeners"),
        Ok(n) => tracing::warn!(
            found = n,
            listeners = ports.len(),
            "TCP_NODELAY not set on every broker listener: forwarded messages may wait for Nagle (tens of ms)"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "cannot set TCP_NODELAY on broker listeners: forwarded messages may wait for Nagle (tens of ms)"
        ),
    }
    Ok(link)
}

/// This process's open file descriptors (Linux: `/proc/self/fd`).
fn open_descriptors() -> std::io::Result<Vec<i32>> {
    Ok(std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect())
}

/// Sets TCP_NODELAY on this process's TCP sockets bound to one of `ports` (the broker's listeners
/// and anything they accepted already), returning how many it set.
///
/// Why: rumqttd writes each forwarded QoS 0 message as its own small segment on sockets without
/// TCP_NODELAY, so a message queued behind an unacknowledged one waits for the subscriber's
/// delayed ACK: 10-40 ms per hop from phone to ingest to viewer. rumqttd offers no option and
/// binds its listener itself, but Linux gives an accepted socket the listener's TCP_NODELAY, and
/// the listener is one of this process's file descriptors: find it by its local port.
pub fn no_delay_on_listeners(ports: &[u16]) -> std::io::Result<usize> {
    on_listeners(ports, |sock| sock.set_tcp_nodelay(true).is_ok())
}

/// Calls `f` on each TCP socket of this process bound to one of `ports`; counts the calls that
/// returned true.
fn on_listeners(
    ports: &[u16],
    mut f: impl FnMut(&socket2::SockRef<'_>) -> bool,
) -> std::io::Result<usize> {
    use std::os::fd::BorrowedFd;
    let mut n = 0;
    for fd in open_descriptors()? {
        let is_socket = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is only borrowed for the calls below and never closed here. If
        // another thread closes it meanwhile and the number is reused, the calls fail or touch a
        // socket that the port check below rejects unless it is one of the broker's own.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&fd);
        if sock.r#type().ok() != Some(socket2::Type::STREAM) {
            continue;
        }
        let port = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port());
        if port.is_some_and(|p| ports.contains(&p)) && f(&sock) {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_loads_with_the_listen_override() {
        let addr: SocketAddr = "127.0.0.1:28883".parse().unwrap();
        let c = load_config(None, addr).unwrap();
        let v4 = c.v4.unwrap();
        assert_eq!(v4.values().next().unwrap().listen, addr);
    }

    /// The server side of `client`'s connection, found among this process's descriptors.
    fn accepted_nodelay(client: &std::net::TcpStream) -> Option<bool> {
        use std::os::fd::BorrowedFd;
        let peer = client.local_addr().unwrap();
        for fd in open_descriptors().unwrap() {
            // SAFETY: borrowed for two getsockopt calls; the test opens and closes nothing meanwhile.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let sock = socket2::SockRef::from(&fd);
            if sock.peer_addr().ok().and_then(|a| a.as_socket()) == Some(peer) {
                return sock.tcp_nodelay().ok();
            }
        }
        None
    }

    #[test]
    fn sockets_the_broker_accepts_have_tcp_nodelay() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        start(load_config(None, addr).unwrap(), addr).unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        // Our side is a plain socket: the check below can tell the two apart.
        assert!(!client.nodelay().unwrap());
        let deadline = Instant::now() + Duration::from_secs(5);
        let server_side = loop {
            if let Some(flag) = accepted_nodelay(&client) {
                break flag;
            }
            assert!(
                Instant::now() < deadline,
                "broker never accepted the connection"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(server_side, "rumqttd's accepted socket lacks TCP_NODELAY");
    }
}
