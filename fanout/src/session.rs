//! One viewer connection (the viewer policy of the edge's door: the door did the WebSocket
//! handshake): CONNECT with the tracking token, SUBSCRIBE to its order only, then the order's
//! points from its bounded queue until the viewer leaves, its token expires, its order ends or
//! the process stops. Every write is raced against those ends, so a viewer whose socket is
//! stuck is still closed within a second.

use crate::authz::{self, Grant};
use crate::codec::{self, CloseReason, ConnectOutcome, Inbound, Version};
use crate::events::ViewerRefusal;
use crate::gateway::Gateway;
use crate::hub::Viewer;
use crate::queue::Pacer;
use bytes::{Bytes, BytesMut};
use courier_wire::clock::unix_now;
use edge::transport::Transport;
use edge::PendingSlot;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

/// How long the goodbye (DISCONNECT, close frame) may take before the socket is dropped.
const GOODBYE: Duration = Duration::from_millis(200);

pub(crate) async fn run<T: Transport>(
    gw: Arc<Gateway>,
    mut ws: T,
    pending: PendingSlot,
    deadline: Instant,
    shutdown: CancellationToken,
) {
    let (_slot, has_room) = gw.slot();
    let cfg = &gw.config;
    let mut buf = BytesMut::new();
    let first = tokio::select! {
        r = timeout_at(deadline, next_packet(&mut ws, &mut buf, None, cfg.max_packet_bytes)) => r,
        _ = shutdown.cancelled() => return,
    };
    let (version, keep_alive, password) = match first {
        Ok(Ok(Some(Inbound::Connect {
            version,
            keep_alive,
            password,
            ..
        }))) => (version, keep_alive, password),
        Ok(Ok(None)) => return,
        Ok(_) => return gw.metrics.refused(&gw.stats, ViewerRefusal::Protocol),
        Err(_) => return gw.metrics.refused(&gw.stats, ViewerRefusal::Timeout),
    };
    if !has_room {
        return refuse(
            &gw,
            &mut ws,
            version,
            ConnectOutcome::Busy,
            ViewerRefusal::MaxViewers,
        )
        .await;
    }
    let grant = match authz::check_token(&gw.tokens, password.as_deref(), unix_now() as u64) {
        Ok(g) => g,
        Err(why) => return refuse(&gw, &mut ws, version, ConnectOutcome::NotAuthorized, why).await,
    };
    let Some(_token_slot) = gw.token_slot(password.as_deref().unwrap_or_default()) else {
        return refuse(
            &gw,
            &mut ws,
            version,
            ConnectOutcome::Busy,
            ViewerRefusal::TokenSessions,
        )
        .await;
    };
    // The order must still run: `delivered` removes it from order:courier.
    let mut redis = gw.redis.clone();
    let courier = match timeout(
        Duration::from_secs(2),
        redis::cmd("HGET")
            .arg(&gw.keys.order_courier)
            .arg(&grant.order)
            .query_async::<Option<String>>(&mut redis),
    )
    .await
    {
        Ok(Ok(Some(c))) => c,
        Ok(Ok(None)) => {
            return refuse(
                &gw,
                &mut ws,
                version,
                ConnectOutcome::NotAuthorized,
                ViewerRefusal::OrderEnded,
            )
            .await
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "redis unavailable at CONNECT; viewer asked to retry");
            return refuse(
                &gw,
                &mut ws,
                version,
                ConnectOutcome::Busy,
                ViewerRefusal::Unavailable,
            )
            .await;
        }
        Err(_) => {
            tracing::warn!("redis too slow at CONNECT; viewer asked to retry");
            return refuse(
                &gw,
                &mut ws,
                version,
                ConnectOutcome::Busy,
                ViewerRefusal::Unavailable,
            )
            .await;
        }
    };
    let viewer = match gw.hub.join(
        &grant.order,
        cfg.queue_capacity,
        !cfg.send_interval.is_zero(),
    ) {
        Ok(v) => v,
        Err(_) => {
            return refuse(
                &gw,
                &mut ws,
                version,
                ConnectOutcome::NotAuthorized,
                ViewerRefusal::OrderEnded,
            )
            .await
        }
    };
    drop(pending);
    if timeout(
        GOODBYE * 5,
        ws.write(&codec::connack(version, ConnectOutcome::Accepted)),
    )
    .await
    .map_or(true, |r| r.is_err())
    {
        gw.hub.leave(&viewer);
        return;
    }
    gw.metrics.viewer_connected(&gw.stats, true);
    let mut s = Session {
        gw: &gw,
        ws,
        buf,
        version,
        topic: courier_wire::track_topic(&grant.order),
        courier,
        viewer: viewer.clone(),
        subscribed: false,
        expires: token_deadline(&grant),
        keep_alive: (keep_alive > 0).then(|| Duration::from_millis(keep_alive as u64 * 1500)),
        pacer: Pacer::new(cfg.send_interval),
        batch: Vec::new(),
    };
    let reason = s.serve(&shutdown).await;
    if s.subscribed {
        gw.stats.subscribed.fetch_sub(1, Relaxed);
    }
    gw.hub.leave(&viewer);
    gw.metrics.viewer_connected(&gw.stats, false);
    if let Some(reason) = reason {
        s.goodbye(reason).await;
    }
}

/// Answers CONNECT with a refusal, counts it, and closes.
async fn refuse<T: Transport>(
    gw: &Gateway,
    ws: &mut T,
    version: Version,
    outcome: ConnectOutcome,
    why: ViewerRefusal,
) {
    gw.metrics.refused(&gw.stats, why);
    let ack = codec::connack(version, outcome);
    let _ = timeout(GOODBYE, async {
        if ws.write(&ack).await.is_ok() {
            ws.close().await
        }
    })
    .await;
}

/// The instant the token expires, on the tokio clock.
fn token_deadline(g: &Grant) -> Instant {
    let left = (g.exp as f64 - unix_now()).max(0.0);
    Instant::now() + Duration::from_secs_f64(left)
}

/// Reads until one whole MQTT packet is there: `Ok(None)` when the viewer closed.
async fn next_packet<T: Transport>(
    ws: &mut T,
    buf: &mut BytesMut,
    version: Option<Version>,
    max: usize,
) -> Result<Option<Inbound>, ()> {
    loop {
        if let Some(p) = codec::decode(version, buf, max).map_err(|_| ())? {
            return Ok(Some(p));
        }
        match ws.read_into(buf).await {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            // A text frame (MQTT over WebSocket is binary) or a broken stream.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Err(()),
            Err(_) => return Ok(None),
        }
    }
}

struct Session<'a, T> {
    gw: &'a Gateway,
    ws: T,
    buf: BytesMut,
    version: Version,
    topic: String,
    courier: String,
    viewer: Arc<Viewer>,
    subscribed: bool,
    expires: Instant,
    keep_alive: Option<Duration>,
    pacer: Pacer,
    batch: Vec<Bytes>,
}

/// Why a write did not complete.
enum Cut {
    /// The socket failed: nothing more can be said.
    Gone,
    /// An end came first: say it (MQTT 5) and close.
    End(CloseReason),
}

impl<T: Transport> Session<'_, T> {
    /// Runs until the end; `Some(reason)` when the gateway closes (and should say why).
    async fn serve(&mut self, shutdown: &CancellationToken) -> Option<CloseReason> {
        let mut last_in = Instant::now();
        let mut pace_wait: Option<Instant> = None;
        // A client may send SUBSCRIBE in the same frame as CONNECT.
        match self.handle_packets(shutdown).await {
            Ok(()) => {}
            Err(Cut::Gone) => return None,
            Err(Cut::End(r)) => return Some(r),
        }
        loop {
            let ka_deadline = self.keep_alive.map(|k| last_in + k);
            let step = tokio::select! {
                biased;
                _ = self.viewer.ended.cancelled() => Err(Cut::End(CloseReason::NotAuthorized)),
                _ = shutdown.cancelled() => Err(Cut::End(CloseReason::ServerShuttingDown)),
                _ = sleep_until(self.expires) => {
                    self.gw.metrics.refused(&self.gw.stats, ViewerRefusal::ExpiredToken);
                    Err(Cut::End(CloseReason::TokenExpired))
                }
                _ = sleep_until(ka_deadline.unwrap_or(self.expires)), if ka_deadline.is_some() => {
                    self.gw.metrics.refused(&self.gw.stats, ViewerRefusal::Timeout);
                    Err(Cut::End(CloseReason::KeepAliveTimeout))
                }
                _ = sleep_until(pace_wait.unwrap_or(self.expires)), if pace_wait.is_some() => {
                    pace_wait = None;
                    self.send_pending(&mut pace_wait, shutdown).await
                }
                _ = self.viewer.ready.notified(), if pace_wait.is_none() => self.send_pending(&mut pace_wait, shutdown).await,
                r = self.ws.read_into(&mut self.buf) => {
                    last_in = Instant::now();
                    match r {
                        Ok(0) => Err(Cut::Gone),
                        Ok(_) => self.handle_packets(shutdown).await,
                        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                            self.gw.metrics.refused(&self.gw.stats, ViewerRefusal::Protocol);
                            Err(Cut::End(CloseReason::ProtocolError))
                        }
                        Err(_) => Err(Cut::Gone),
                    }
                }
            };
            match step {
                Ok(()) => {}
                Err(Cut::Gone) => return None,
                Err(Cut::End(r)) => return Some(r),
            }
        }
    }

    /// Writes `frames`, racing the ends of the session.
    async fn write(
        &mut self,
        frames: impl IntoIterator<Item = Bytes>,
        shutdown: &CancellationToken,
    ) -> Result<(), Cut> {
        // One write for the batch: a WebSocket message may carry several MQTT packets.
        let mut out = BytesMut::new();
        for f in frames {
            out.extend_from_slice(&f);
        }
        let ws = &mut self.ws;
        let write = ws.write(&out);
        tokio::select! {
            r = write => r.map_err(|_| Cut::Gone),
            _ = self.viewer.ended.cancelled() => Err(Cut::End(CloseReason::NotAuthorized)),
            _ = shutdown.cancelled() => Err(Cut::End(CloseReason::ServerShuttingDown)),
            _ = sleep_until(self.expires) => Err(Cut::End(CloseReason::TokenExpired)),
        }
    }

    async fn send_pending(
        &mut self,
        pace_wait: &mut Option<Instant>,
        shutdown: &CancellationToken,
    ) -> Result<(), Cut> {
        if let Err(at) = self.pacer.ready(Instant::now().into_std()) {
            *pace_wait = Some(at.into());
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.batch);
        self.viewer.take(&mut batch);
        let n = batch.len() as u64;
        let (version, topic) = (self.version, self.topic.clone());
        let r = self
            .write(
                batch.drain(..).map(|p| codec::publish(version, &topic, p)),
                shutdown,
            )
            .await;
        self.batch = batch;
        if r.is_ok() {
            self.gw.metrics.sent(&self.gw.stats, n);
        }
        r
    }

    async fn handle_packets(&mut self, shutdown: &CancellationToken) -> Result<(), Cut> {
        loop {
            let p = match codec::decode(
                Some(self.version),
                &mut self.buf,
                self.gw.config.max_packet_bytes,
            ) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(_) => {
                    self.gw
                        .metrics
                        .refused(&self.gw.stats, ViewerRefusal::Protocol);
                    return Err(Cut::End(CloseReason::ProtocolError));
                }
            };
            match p {
                Inbound::Subscribe { pkid, filters } => {
                    let order = self.viewer.order.clone();
                    let granted: Vec<bool> = filters
                        .iter()
                        .map(|f| authz::filter_allowed(&order, f))
                        .collect();
                    for _ in granted.iter().filter(|g| !**g) {
                        self.gw
                            .metrics
                            .refused(&self.gw.stats, ViewerRefusal::Filter);
                    }
                    let ack = codec::suback(self.version, pkid, &granted);
                    self.write([ack], shutdown).await?;
                    if granted.contains(&true) && !self.subscribed {
                        self.subscribed = true;
                        self.gw.stats.subscribed.fetch_add(1, Relaxed);
                        match self.gw.hub.activate(&self.viewer) {
                            Some(last) => self.viewer.offer_initial(last),
                            None => {
                                if let Some(p) = self.last_position().await {
                                    self.viewer.offer_initial(p);
                                }
                            }
                        }
                    }
                }
                Inbound::Unsubscribe { pkid, filters } => {
                    if self.subscribed && filters.contains(&self.topic) {
                        self.subscribed = false;
                        self.gw.stats.subscribed.fetch_sub(1, Relaxed);
                        self.viewer.deactivate();
                    }
                    let ack = codec::unsuback(self.version, pkid, filters.len());
                    self.write([ack], shutdown).await?;
                }
                Inbound::PingReq => {
                    let pong = codec::pingresp(self.version);
                    self.write([pong], shutdown).await?;
                }
                Inbound::Disconnect { .. } => return Err(Cut::Gone),
                Inbound::Publish(_) => {
                    self.gw
                        .metrics
                        .refused(&self.gw.stats, ViewerRefusal::Publish);
                    return Err(Cut::End(CloseReason::NotAuthorized));
                }
                Inbound::Connect { .. } | Inbound::Unexpected => {
                    self.gw
                        .metrics
                        .refused(&self.gw.stats, ViewerRefusal::Protocol);
                    return Err(Cut::End(CloseReason::ProtocolError));
                }
            }
        }
    }

    /// The courier's last accepted location from `couriers:live` when this process has seen
    /// no point of the order yet (it started after the last one). Its time is the server's
    /// receive time of that point: from the courier's seq state (`couriers:seen` is written
    /// once per `ingest.seen_every` bucket, so its score may lag), else from `couriers:seen`.
    async fn last_position(&self) -> Option<Bytes> {
        let mut redis = self.gw.redis.clone();
        let keys = &self.gw.keys;
        let mut pipe = redis::pipe();
        pipe.cmd("GEOPOS")
            .arg(&keys.live)
            .arg(&self.courier)
            .cmd("ZSCORE")
            .arg(&keys.seen)
            .arg(&self.courier)
            .cmd("HGET")
            .arg(&keys.seq)
            .arg(&self.courier);
        let query =
            pipe.query_async::<(Vec<Option<(f64, f64)>>, Option<f64>, Option<Vec<u8>>)>(&mut redis);
        match timeout(Duration::from_secs(1), query).await {
            Ok(Ok((pos, seen, state))) => {
                let (lon, lat) = pos.into_iter().next().flatten()?;
                let at = state
                    .and_then(|s| courier_wire::SeqState::decode(&s))
                    .map(|s| s.server_ts)
                    .or(seen)
                    .unwrap_or_else(unix_now);
                Some(Bytes::from(courier_wire::encode_track(lat, lon, at)))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "last position lookup failed");
                None
            }
            Err(_) => None,
        }
    }

    /// MQTT 5 viewers are told why; then the close frame; never longer than [`GOODBYE`].
    async fn goodbye(&mut self, reason: CloseReason) {
        let ws = &mut self.ws;
        let bye = codec::disconnect(self.version, reason);
        let _ = timeout(GOODBYE, async {
            if let Some(d) = bye {
                if ws.write(&d).await.is_err() {
                    return;
                }
            }
            ws.close().await
        })
        .await;
    }
}
