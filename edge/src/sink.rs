//! Where the phones' messages go: the bus queue, drained either by the embedded broker's
//! in-process link (`courier-pipeline run`, in the binary's broker module) or, for an edge
//! process of its own, by [`mqtt`]: a few MQTT connections to the bus at `MQTT_URL` with a
//! service login, each courier's messages always on the same one (see [`connection_for`]).

use crate::events::Stats;
use crate::Message;
use bytes::BytesMut;
use courier_wire::metrics as m;
use courier_wire::MqttEndpoint;
use rumqttc::mqttbytes::v4;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

/// The receiving end of the edge's bounded queue to the bus.
pub struct Queue {
    pub(crate) rx: mpsc::Receiver<Message>,
    pub(crate) depth: metrics::Gauge,
}

impl Queue {
    /// Waits for at least one message (blocking the thread: for a forwarder thread of its
    /// own) and moves up to `limit` into `out`; 0 when the edge has stopped and the queue is
    /// empty.
    pub fn blocking_recv_many(&mut self, out: &mut Vec<Message>, limit: usize) -> usize {
        let n = self.rx.blocking_recv_many(out, limit);
        self.depth.set(self.rx.len() as f64);
        n
    }

    /// Async form of [`Queue::blocking_recv_many`].
    pub(crate) async fn recv_many(&mut self, out: &mut Vec<Message>, limit: usize) -> usize {
        let n = self.rx.recv_many(out, limit).await;
        self.depth.set(self.rx.len() as f64);
        n
    }
}

/// The bus connection (of `n`) that carries the messages of `topic`'s courier: the same one for
/// his points, his status and his Will, so the bus gets them in the order the phone sent them.
/// Round robin per message let a later point (or the Will's `offline`) overtake an earlier one
/// on the other connection: the earlier one was then stale, or the courier live again after
/// his `offline`.
pub(crate) fn connection_for(topic: &str, n: usize) -> usize {
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

/// Messages waiting for one bus connection; when full, new ones are dropped (`queue_full`).
const CONNECTION_QUEUE: usize = 16_384;
/// Messages written to the bus with one write.
const BATCH: usize = 512;
/// How long a bus connection gathers messages before a write that is not full.
const GATHER: Duration = Duration::from_millis(1);
/// Keep-alive announced in CONNECT; a PINGREQ goes out at half of it.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Forwards `queue` to the bus at `endpoint` over `connections` MQTT connections until the
/// queue closes (the edge stopped and every session ended, its Wills queued), then disconnects.
///
/// The bus connections are MQTT 3.1.1 written here on rumqttc's packet codecs, not rumqttc's
/// client: that client writes and flushes every publish on its own (one `writev` each, and on
/// loopback the bus's receive work too, on the edge's CPU), where this writes a batch of up to
/// 512 queued messages at once. What is written by hand: connect and read the CONNACK, then
/// PUBLISH QoS 0 batches, a PINGREQ every 15 s, reconnect after a failure.
pub(crate) async fn mqtt(
    endpoint: MqttEndpoint,
    connections: usize,
    mut queue: Queue,
    stats: Arc<Stats>,
) {
    let tasks = TaskTracker::new();
    let up = Arc::new(AtomicUsize::new(0));
    let mut lanes = Vec::with_capacity(connections);
    for i in 0..connections.max(1) {
        let (tx, rx) = mpsc::channel(CONNECTION_QUEUE);
        lanes.push(tx);
        let id = courier_wire::mqtt::client_id("edge", i);
        tasks.spawn(connection(
            endpoint.clone(),
            id,
            rx,
            stats.clone(),
            up.clone(),
        ));
    }
    let dropped = metrics::counter!(m::EDGE_MESSAGES, "result" => "queue_full");
    let mut batch = Vec::with_capacity(BATCH);
    while queue.recv_many(&mut batch, BATCH).await > 0 {
        let mut lost = 0;
        for msg in batch.drain(..) {
            if lanes[connection_for(&msg.topic, lanes.len())]
                .try_send(msg)
                .is_err()
            {
                lost += 1;
            }
        }
        if lost > 0 {
            dropped.increment(lost);
            stats.queue_full.fetch_add(lost, Relaxed);
        }
    }
    // Closing the lanes lets each connection write what it holds and disconnect.
    drop(lanes);
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(3), tasks.wait()).await;
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Opens the connection (TCP, or TLS for `mqtts://`), sends CONNECT with the service login and
/// waits for a successful CONNACK.
async fn open(endpoint: &MqttEndpoint, client_id: &str) -> std::io::Result<Box<dyn Io>> {
    use std::io::{Error, ErrorKind};
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
    tcp.set_nodelay(true)?;
    let mut io: Box<dyn Io> = if endpoint.tls {
        let connector = tls_connector(endpoint.ca_pem.as_deref())?;
        let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
            .map_err(|e| Error::new(ErrorKind::InvalidInput, e))?;
        Box::new(connector.connect(name, tcp).await?)
    } else {
        Box::new(tcp)
    };
    let mut c = v4::Connect::new(client_id);
    c.keep_alive = KEEP_ALIVE.as_secs() as u16;
    if let Some(user) = &endpoint.username {
        c.set_login(user.clone(), endpoint.password.clone().unwrap_or_default());
    }
    let mut out = BytesMut::new();
    v4::Packet::Connect(c)
        .write(&mut out, usize::MAX)
        .map_err(|e| Error::new(ErrorKind::InvalidData, e.to_string()))?;
    io.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(64);
    loop {
        match v4::Packet::read(&mut buf, 1 << 16) {
            Ok(v4::Packet::ConnAck(a)) if a.code == v4::ConnectReturnCode::Success => {
                return Ok(io)
            }
            Ok(v4::Packet::ConnAck(a)) => {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!("the bus refused the edge's login: {:?}", a.code),
                ))
            }
            Ok(_) => {}
            Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {
                if io.read_buf(&mut buf).await? == 0 {
                    return Err(ErrorKind::UnexpectedEof.into());
                }
            }
            Err(e) => return Err(Error::new(ErrorKind::InvalidData, e.to_string())),
        }
    }
}

fn tls_connector(ca_pem: Option<&[u8]>) -> std::io::Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use std::io::{Error, ErrorKind};
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| Error::new(ErrorKind::InvalidData, e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::new(ErrorKind::InvalidData, e.to_string()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::other(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// One bus connection: connects (again after a failure, backing off), then writes what its
/// lane brings in batches until the lane closes.
async fn connection(
    endpoint: MqttEndpoint,
    client_id: String,
    mut rx: mpsc::Receiver<Message>,
    stats: Arc<Stats>,
    up: Arc<AtomicUsize>,
) {
    let connected = metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "connected");
    let disconnected = metrics::counter!(m::MQTT_CONNECTION_EVENTS, "state" => "disconnected");
    let lost = metrics::counter!(m::EDGE_MESSAGES, "result" => "queue_full");
    let mut backoff = Duration::from_millis(250);
    let mut batch = Vec::with_capacity(BATCH);
    let mut out = BytesMut::with_capacity(64 * 1024);
    loop {
        let stopped = rx.is_closed();
        let io = tokio::select! {
            r = open(&endpoint, &client_id) => r,
            // Stopped while the bus is away: a last try, then what is left is lost (counted).
            _ = tokio::time::sleep(Duration::from_secs(3)), if stopped => {
                let left = rx.len() as u64;
                lost.increment(left);
                stats.queue_full.fetch_add(left, Relaxed);
                return;
            }
        };
        let io = match io {
            Ok(io) => io,
            Err(e) => {
                tracing::warn!(role = "edge", error = %e, "bus connection failed; retrying");
                if rx.is_closed() && rx.is_empty() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(250);
        connected.increment(1);
        if up.fetch_add(1, Relaxed) == 0 {
            stats.bus_up.set(true);
        }
        let (mut rd, mut wr) = tokio::io::split(io);
        let mut ping = tokio::time::interval(KEEP_ALIVE / 2);
        ping.tick().await;
        let mut scratch = [0u8; 256];
        let finished = loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, BATCH) => {
                    let mut n = n;
                    if n > 0 && n < BATCH {
                        // Gather for a millisecond (the timer's resolution): under load the batch
                        // grows to many messages per write instead of one or two (each write to
                        // the bus is a syscall and a segment, and on loopback the bus's receive
                        // work too). A point waits 1 ms more at most.
                        tokio::time::sleep(GATHER).await;
                        while n < BATCH {
                            match rx.try_recv() {
                                Ok(m) => {
                                    batch.push(m);
                                    n += 1;
                                }
                                Err(_) => break,
                            }
                        }
                    }
                    if n == 0 {
                        out.clear();
                        out.extend_from_slice(&[0xE0, 0x00]); // DISCONNECT
                        let _ = wr.write_all(&out).await;
                        break true;
                    }
                    out.clear();
                    for msg in batch.drain(..) {
                        let p = v4::Publish::from_bytes(msg.topic, rumqttc::QoS::AtMostOnce, msg.payload);
                        // A topic or payload too large for MQTT cannot come from the edge's
                        // sessions (they are bounded by max_packet_bytes).
                        let _ = v4::Packet::Publish(p).write(&mut out, usize::MAX);
                    }
                    if wr.write_all(&out).await.is_err() {
                        lost.increment(n as u64);
                        stats.queue_full.fetch_add(n as u64, Relaxed);
                        break false;
                    }
                }
                _ = ping.tick() => {
                    if wr.write_all(&[0xC0, 0x00]).await.is_err() { // PINGREQ
                        break false;
                    }
                }
                r = rd.read(&mut scratch) => match r {
                    // PINGRESP, or nothing a QoS 0 publisher needs.
                    Ok(n) if n > 0 => {}
                    _ => break false,
                },
            }
        };
        disconnected.increment(1);
        if up.fetch_sub(1, Relaxed) == 1 {
            stats.bus_up.set(false);
        }
        if finished {
            return;
        }
        tracing::warn!(role = "edge", "bus connection lost; reconnecting");
    }
}
