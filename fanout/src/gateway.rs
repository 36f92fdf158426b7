//! The viewer gateway: the viewer policy behind the edge's door (its WebSocket listener on
//! `/mqtt`, subprotocol `mqtt`, handshakes under the connect deadline, the bound on connections
//! not logged in yet); every connection is one [`crate::session`]. It never publishes to the
//! broker; viewers only receive.

use crate::config::FanoutConfig;
use crate::error::FanoutError;
use crate::events::ViewerRefusal;
use crate::events::{Metrics, Stats};
use crate::hub::Hub;
use crate::session;
use courier_auth::Verifier;
use courier_wire::Keys;
use edge::transport::Transport;
use edge::{DoorRefusal, DoorSettings, PendingSlot, Via};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What every session of one process shares.
pub(crate) struct Gateway {
    pub hub: Arc<Hub>,
    /// The viewer audience's public keys.
    pub tokens: Verifier,
    pub redis: courier_wire::RedisConn,
    pub keys: Keys,
    pub config: FanoutConfig,
    pub metrics: Arc<Metrics>,
    pub stats: Arc<Stats>,
    /// Open connections past their WebSocket handshake.
    pub connections: AtomicUsize,
    /// Sessions by tracking token (a hash of it: the token itself is a secret).
    pub token_sessions: Mutex<HashMap<u64, usize>>,
    pub token_hasher: std::hash::RandomState,
}

/// One open connection; counted while it lives.
pub(crate) struct Slot<'a>(&'a AtomicUsize);

impl Gateway {
    /// Takes a connection slot; `None` when the gateway holds `max_viewers` already.
    pub(crate) fn slot(&self) -> (Slot<'_>, bool) {
        let n = self.connections.fetch_add(1, Relaxed);
        (Slot(&self.connections), n < self.config.max_viewers)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// One session of a token; counted while it lives.
pub(crate) struct TokenSlot<'a> {
    gw: &'a Gateway,
    key: u64,
}

impl Gateway {
    /// Counts a session of `token`; `None` when it has `max_sessions_per_token` already.
    pub(crate) fn token_slot(&self, token: &str) -> Option<TokenSlot<'_>> {
        use std::hash::BuildHasher;
        let key = self.token_hasher.hash_one(token);
        let mut map = self
            .token_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key).or_insert(0);
        if *n >= self.config.max_sessions_per_token {
            return None;
        }
        *n += 1;
        Some(TokenSlot { gw: self, key })
    }
}

impl Drop for TokenSlot<'_> {
    fn drop(&mut self) {
        let mut map = self
            .gw
            .token_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

impl edge::Policy for Gateway {
    fn serve<T: Transport + 'static>(
        self: Arc<Self>,
        io: T,
        _via: Via,
        slot: PendingSlot,
        deadline: Instant,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        session::run(self, io, slot, deadline, shutdown)
    }

    fn refused_at_door(&self, why: DoorRefusal) {
        let r = match why {
            DoorRefusal::Full => ViewerRefusal::MaxViewers,
            DoorRefusal::Handshake {
                timed_out: true, ..
            } => ViewerRefusal::Timeout,
            DoorRefusal::Handshake { .. } => ViewerRefusal::Protocol,
        };
        self.metrics.refused(&self.stats, r);
    }
}

/// Accepts viewers until `shutdown`; then the sessions close (each watches `shutdown`) and
/// this waits briefly for them.
pub(crate) async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), FanoutError> {
    let door = edge::Door::websocket(
        listener,
        DoorSettings {
            // Handshakes and CONNECTs in progress; logged-in viewers are bounded by max_viewers.
            max_pending: gw.config.max_viewers.min(4096),
            connect_timeout: gw.config.connect_timeout,
            max_packet_bytes: gw.config.max_packet_bytes,
            reuse_port: false,
        },
    );
    let tasks = door.run(gw, shutdown).await;
    if tokio::time::timeout(Duration::from_secs(2), tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            left = tasks.len(),
            "viewer sessions still closing at shutdown"
        );
    }
    Ok(())
}
