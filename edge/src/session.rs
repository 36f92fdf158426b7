//! One phone's connection: CONNECT checked by the courier policy, then every packet authorized
//! until the phone leaves, its token expires, another login takes over, or the process stops.
//!
//! Memory is the budget here (tens of thousands of idle phones per process): a session holds no
//! buffer while idle. It reads into a small chunk on its own stack frame and keeps bytes only
//! while a packet is incomplete; the decoded payloads go to the bus queue and are freed there.
//! One timer serves both the keep-alive and the token's expiry, re-armed only when it fires.

use crate::codec::{self, Ack, CloseReason, ConnectOutcome, Inbound, Limits, Version};
use crate::events::{Metrics, Stats, Via};
use crate::policy::{self, Login, Refusal, Shift, Verdict};
use crate::registry::{Kick, Registry, Take};
use crate::source::{DoorRefusal, PendingSlot};
use crate::transport::Transport;
use crate::{EdgeSettings, Message};
use bytes::{Bytes, BytesMut};
use courier_auth::Verifier;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

/// A write (an acknowledgement) that takes longer than this means the phone is gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the goodbye (DISCONNECT, close) may take.
const GOODBYE: Duration = Duration::from_millis(200);

/// What every session of one process shares.
pub(crate) struct Shared {
    pub keys: Verifier,
    pub settings: EdgeSettings,
    pub bus: mpsc::Sender<Message>,
    pub registry: Registry,
    pub metrics: Metrics,
    pub stats: Arc<Stats>,
    /// Phones logged in.
    pub connected: AtomicUsize,
    pub next_conn: AtomicU64,
    /// The rate limiter's clock.
    pub epoch: std::time::Instant,
}

impl Shared {
    /// Hands a message to the bus queue; a full queue drops it (counted).
    fn forward(&self, topic: String, payload: Bytes) -> bool {
        match self.bus.try_send(Message { topic, payload }) {
            Ok(()) => true,
            Err(_) => {
                self.metrics.queue_full(&self.stats, 1);
                false
            }
        }
    }
}

impl crate::source::Policy for Shared {
    fn serve<T: Transport + 'static>(
        self: Arc<Self>,
        io: T,
        via: Via,
        slot: PendingSlot,
        deadline: Instant,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        serve(self, io, via, slot, deadline, shutdown)
    }

    fn refused_at_door(&self, why: DoorRefusal) {
        let r = match why {
            DoorRefusal::Full => Refusal::Full,
            DoorRefusal::Handshake { via: Via::Ws, .. } => Refusal::WebSocket,
            DoorRefusal::Handshake { .. } => Refusal::Tls,
        };
        self.metrics.refused(&self.stats, r);
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// DISCONNECT; MQTT 5 reason 0x04 asks for the Will anyway.
    Disconnect {
        with_will: bool,
    },
    /// The socket closed or failed without DISCONNECT.
    Dropped,
    TakenOver,
    Shutdown,
    /// The edge closes: say why (MQTT 5) and publish the Will.
    Close(CloseReason),
}

impl End {
    /// Whether the Will goes out. Not on a takeover (the new connection's `online` came
    /// first) and not when the edge itself stops (a rolling restart is not every courier
    /// going offline: the phones reconnect to another edge process).
    fn publishes_will(self) -> bool {
        match self {
            End::Disconnect { with_will } => with_will,
            End::Dropped | End::Close(_) => true,
            End::TakenOver | End::Shutdown => false,
        }
    }
}

fn close_reason(r: Refusal) -> CloseReason {
    match r {
        Refusal::Retain => CloseReason::RetainNotSupported,
        Refusal::Qos => CloseReason::QosNotSupported,
        Refusal::TooLarge => CloseReason::PacketTooLarge,
        Refusal::Protocol => CloseReason::ProtocolError,
        Refusal::ExpiredToken => CloseReason::TokenExpired,
        Refusal::Timeout => CloseReason::KeepAliveTimeout,
        _ => CloseReason::NotAuthorized,
    }
}

async fn send<T: Transport>(io: &mut T, bytes: &[u8]) -> bool {
    matches!(timeout(WRITE_TIMEOUT, io.write(bytes)).await, Ok(Ok(())))
}

/// A phone whose CONNECT was accepted.
struct Accepted {
    version: Version,
    keep_alive: u16,
    login: Login,
    /// Bytes after the CONNECT (a PUBLISH in the same segment).
    buf: BytesMut,
    conn: u64,
    kick: Arc<Kick>,
    expires: Instant,
    /// The CONNACK was written.
    acked: bool,
}

/// Serves one connection until it ends. `slot` is released once the phone is logged in;
/// `deadline` bounds everything before that (handshakes included).
pub(crate) async fn serve<T: Transport>(
    sh: Arc<Shared>,
    mut io: T,
    via: Via,
    slot: PendingSlot,
    deadline: Instant,
    shutdown: CancellationToken,
) {
    // The phases before and after the connected loop run boxed: their state (the CONNECT and
    // its token, timers, the goodbye) is needed once per connection, not in every idle phone's
    // task.
    let Some(a) = Box::pin(log_in(&sh, &mut io, slot, deadline, &shutdown)).await else {
        return;
    };
    let end = if !a.acked {
        End::Dropped
    } else {
        sh.metrics.login(&sh.stats, via);
        let mut s = Session {
            sh: &sh,
            version: a.version,
            conn: a.conn,
            courier: &a.login.courier,
        };
        // Registered first, then checked: a stop that came before the registration is seen
        // here, one that comes after reaches the session through its kick.
        let end = if shutdown.is_cancelled() {
            End::Shutdown
        } else {
            s.run(&mut io, a.buf, a.keep_alive, a.expires, &a.kick)
                .await
        };
        sh.metrics.logout(&sh.stats);
        end
    };
    sh.registry.release(&a.login.courier, a.conn);
    sh.connected.fetch_sub(1, Relaxed);
    Box::pin(finish(&sh, &mut io, a.version, &a.login, end)).await;
}

/// Reads the CONNECT within the deadline, checks it, registers the courier and answers;
/// `None` when the connection ends here (refused, counted).
async fn log_in<T: Transport>(
    sh: &Shared,
    io: &mut T,
    slot: PendingSlot,
    deadline: Instant,
    shutdown: &CancellationToken,
) -> Option<Accepted> {
    let max = sh.settings.max_packet_bytes;
    let mut buf = BytesMut::new();
    let first = timeout_at(deadline, async {
        loop {
            match codec::decode(None, &mut buf, max) {
                Ok(Some(p)) => return Ok(Some(p)),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            match io.read_into(&mut buf).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(_) => {}
            }
        }
    });
    let first = tokio::select! {
        r = first => r,
        _ = shutdown.cancelled() => return None,
    };
    let refused = |r| {
        sh.metrics.refused(&sh.stats, r);
        None
    };
    let (version, keep_alive, username, password, will) = match first {
        Ok(Ok(Some(Inbound::Connect {
            version,
            keep_alive,
            username,
            password,
            will,
            ..
        }))) => (version, keep_alive, username, password, will),
        Ok(Ok(None)) => return None,
        Ok(Err(codec::DecodeError::TooLarge(_))) => return refused(Refusal::TooLarge),
        Ok(_) => return refused(Refusal::Protocol),
        Err(_) => return refused(Refusal::Timeout),
    };
    let now = courier_wire::clock::unix_now();
    let login = match policy::connect(
        &sh.keys,
        username.as_deref(),
        password.as_deref(),
        will,
        now as u64,
    ) {
        Ok(l) => l,
        Err((outcome, why)) => {
            sh.metrics.refused(&sh.stats, why);
            refuse(io, version, outcome).await;
            return None;
        }
    };
    if buf.is_empty() {
        // The CONNECT's bytes (with the token) are no longer needed.
        buf = BytesMut::new();
    }
    if sh.connected.fetch_add(1, Relaxed) >= sh.settings.max_connections {
        sh.connected.fetch_sub(1, Relaxed);
        sh.metrics.refused(&sh.stats, Refusal::Full);
        refuse(io, version, ConnectOutcome::Busy).await;
        return None;
    }
    drop(slot);
    let conn = sh.next_conn.fetch_add(1, Relaxed);
    let kick = Arc::new(Kick::default());
    let t = sh.epoch.elapsed().as_secs_f64();
    if sh
        .registry
        .claim(&login.courier, conn, kick.clone(), sh.settings.rate, t)
    {
        sh.metrics.takeover(&sh.stats);
    }
    let limits = Limits {
        max_packet: Some(max as u32),
        max_qos: Some(1),
        no_retain: true,
    };
    let acked = send(
        io,
        &codec::connack_with(version, ConnectOutcome::Accepted, limits),
    )
    .await;
    let expires = Instant::now() + Duration::from_secs_f64((login.expires as f64 - now).max(0.0));
    Some(Accepted {
        version,
        keep_alive,
        login,
        buf,
        conn,
        kick,
        expires,
        acked,
    })
}

/// Says why (MQTT 5), closes, and publishes the Will where the end calls for it.
async fn finish<T: Transport>(sh: &Shared, io: &mut T, version: Version, login: &Login, end: End) {
    if end.publishes_will() {
        if let Some(payload) = &login.will {
            if sh.forward(courier_wire::status_topic(&login.courier), payload.clone()) {
                sh.metrics.will(&sh.stats);
            }
        }
    }
    let reason = match end {
        End::Close(r) => Some(r),
        End::TakenOver => Some(CloseReason::SessionTakenOver),
        End::Shutdown => Some(CloseReason::ServerShuttingDown),
        End::Disconnect { .. } | End::Dropped => None,
    };
    if let Some(r) = reason {
        let _ = timeout(GOODBYE, async {
            if let Some(d) = codec::disconnect(version, r) {
                let _ = io.write(&d).await;
            }
            io.close().await
        })
        .await;
    }
}

/// Answers CONNECT with a refusal and closes.
async fn refuse<T: Transport>(io: &mut T, version: Version, outcome: ConnectOutcome) {
    let _ = timeout(GOODBYE, async {
        let _ = io.write(&codec::connack(version, outcome)).await;
        io.close().await
    })
    .await;
}

struct Session<'a> {
    sh: &'a Shared,
    version: Version,
    conn: u64,
    courier: &'a str,
}

/// What woke the session.
enum Wake {
    Read(std::io::Result<usize>),
    Timer,
    End(End),
}

impl Session<'_> {
    async fn run<T: Transport>(
        &mut self,
        io: &mut T,
        mut buf: BytesMut,
        keep_alive: u16,
        expires: Instant,
        kick: &Kick,
    ) -> End {
        let keep_alive = (keep_alive > 0).then(|| Duration::from_millis(keep_alive as u64 * 1500));
        let mut last_in = Instant::now();
        let next = |last_in: Instant| keep_alive.map_or(expires, |k| (last_in + k).min(expires));
        let timer = sleep_until(next(last_in));
        tokio::pin!(timer);
        // A client may send PUBLISH in the same segment as CONNECT. Handling is boxed: its state
        // (a decoded packet, a write in progress) is needed only while a packet is handled, not
        // in every idle phone's task.
        if let Err(end) = Box::pin(self.handle(io, &mut buf)).await {
            return end;
        }
        // Registered once: a fresh `notified()` per wake-up would take the Notify's lock twice
        // for every point.
        let kicked = kick.notified();
        tokio::pin!(kicked);
        loop {
            let wake = tokio::select! {
                biased;
                _ = &mut kicked => Wake::End(if kick.stopping() { End::Shutdown } else { End::TakenOver }),
                _ = &mut timer => Wake::Timer,
                r = io.read_into(&mut buf) => Wake::Read(r),
            };
            match wake {
                Wake::End(e) => return e,
                Wake::Timer => {
                    let now = Instant::now();
                    if now >= expires {
                        self.sh
                            .metrics
                            .refused(&self.sh.stats, Refusal::ExpiredToken);
                        return End::Close(CloseReason::TokenExpired);
                    }
                    if keep_alive.is_some_and(|k| now >= last_in + k) {
                        self.sh.metrics.refused(&self.sh.stats, Refusal::Timeout);
                        return End::Close(CloseReason::KeepAliveTimeout);
                    }
                    timer.as_mut().reset(next(last_in));
                }
                Wake::Read(Ok(0) | Err(_)) => return End::Dropped,
                Wake::Read(Ok(_)) => {
                    last_in = Instant::now();
                    if let Err(end) = Box::pin(self.handle(io, &mut buf)).await {
                        return end;
                    }
                    if buf.is_empty() {
                        // Give the allocation back while idle (decoded payloads keep theirs).
                        buf = BytesMut::new();
                    }
                }
            }
        }
    }

    fn refused(&self, r: Refusal) {
        self.sh.metrics.refused(&self.sh.stats, r);
    }

    /// Acts on every whole packet in `buf`.
    async fn handle<T: Transport>(&mut self, io: &mut T, buf: &mut BytesMut) -> Result<(), End> {
        let v = self.version;
        loop {
            let p = match codec::decode(Some(v), buf, self.sh.settings.max_packet_bytes) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(codec::DecodeError::TooLarge(_)) => {
                    self.refused(Refusal::TooLarge);
                    return Err(End::Close(CloseReason::PacketTooLarge));
                }
                Err(_) => {
                    self.refused(Refusal::Protocol);
                    return Err(End::Close(CloseReason::ProtocolError));
                }
            };
            let reply = match p {
                Inbound::Publish(p) => match policy::publish(self.courier, &p) {
                    Verdict::Forward => {
                        let sh = self.sh;
                        let t = sh.epoch.elapsed().as_secs_f64();
                        let shift = policy::shift(&p);
                        let point = shift == Shift::Point;
                        let ack = match sh.registry.take(
                            self.courier,
                            self.conn,
                            point,
                            sh.settings.rate,
                            t,
                        ) {
                            Take::Empty | Take::NotHis => {
                                sh.metrics.rate_limited(&sh.stats);
                                Ack::QuotaExceeded
                            }
                            // Off shift: never stored, never live; the app is not told (it
                            // has ended the shift itself, and would only retry).
                            Take::OffShift => {
                                sh.metrics.off_shift(&sh.stats);
                                Ack::Taken
                            }
                            Take::Ok => {
                                match shift {
                                    Shift::Ends => {
                                        sh.registry.set_off_shift(self.courier, self.conn, true)
                                    }
                                    Shift::Starts => {
                                        sh.registry.set_off_shift(self.courier, self.conn, false)
                                    }
                                    Shift::Point | Shift::Other => {}
                                }
                                if sh.forward(p.topic, p.payload) {
                                    sh.metrics.forwarded(&sh.stats);
                                }
                                Ack::Taken
                            }
                        };
                        (p.qos == 1).then(|| codec::puback(v, p.pkid, ack))
                    }
                    // MQTT 5 can refuse one QoS 1 PUBLISH and keep the connection.
                    Verdict::Refuse(Refusal::Topic) if v == Version::V5 && p.qos == 1 => {
                        self.refused(Refusal::Topic);
                        Some(codec::puback(v, p.pkid, Ack::NotAuthorized))
                    }
                    Verdict::Refuse(r) => {
                        self.refused(r);
                        return Err(End::Close(close_reason(r)));
                    }
                },
                Inbound::Subscribe { pkid, filters } => {
                    for _ in &filters {
                        self.refused(Refusal::Subscribe);
                    }
                    Some(codec::suback(v, pkid, &vec![false; filters.len()]))
                }
                Inbound::Unsubscribe { pkid, filters } => {
                    Some(codec::unsuback(v, pkid, filters.len()))
                }
                Inbound::PingReq => Some(codec::pingresp(v)),
                Inbound::Disconnect { with_will } => return Err(End::Disconnect { with_will }),
                Inbound::Connect { .. } | Inbound::Unexpected => {
                    self.refused(Refusal::Protocol);
                    return Err(End::Close(CloseReason::ProtocolError));
                }
            };
            if let Some(r) = reply {
                if !send(io, &r).await {
                    return Err(End::Dropped);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins what one idle phone's task holds: the session future (both the CONNECT phase and the
    /// connected loop are laid out in it). Tens of thousands of these live per process.
    #[tokio::test]
    async fn a_session_future_stays_small() {
        let mut bound = crate::Edge {
            settings: crate::EdgeConfig {
                listen: "127.0.0.1:0".into(),
                reuse_port: false,
                ..Default::default()
            }
            .validate()
            .unwrap(),
            keys: courier_auth::Verifier::new(courier_auth::Audience::Courier, []).unwrap(),
            stats: Default::default(),
        }
        .bind()
        .unwrap();
        let _q = bound.take_queue();
        let sh = bound.sh.clone();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let stream = tokio::net::TcpStream::from_std(s).unwrap();
        let slot = PendingSlot::detached();
        let fut = serve(
            sh,
            crate::transport::Tcp(stream),
            Via::Tcp,
            slot,
            Instant::now(),
            CancellationToken::new(),
        );
        let size = std::mem::size_of_val(&fut);
        eprintln!("session future: {size} bytes");
        assert!(size <= 1024, "session future grew to {size} bytes");
    }
}
