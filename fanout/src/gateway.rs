//! The viewer gateway: a WebSocket listener (path `/mqtt`, subprotocol `mqtt`) whose every
//! connection is one [`crate::session`]. It never publishes to the broker; viewers only
//! receive.

use crate::config::FanoutConfig;
use crate::error::FanoutError;
use crate::events::{Metrics, Stats};
use crate::hub::Hub;
use crate::session;
use courier_auth::Keyring;
use courier_wire::Keys;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every session of one process shares.
pub(crate) struct Gateway {
    pub hub: Arc<Hub>,
    pub keyring: Keyring,
    pub redis: redis::aio::ConnectionManager,
    pub keys: Keys,
    pub config: FanoutConfig,
    pub metrics: Arc<Metrics>,
    pub stats: Arc<Stats>,
    /// Open connections (handshaking or connected).
    pub connections: AtomicUsize,
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

/// Accepts viewers until `shutdown`; then tells every session to close and waits briefly.
pub(crate) async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), FanoutError> {
    let tasks = TaskTracker::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tasks.spawn(session::run(gw.clone(), stream, shutdown.clone()));
                }
                Err(e) => {
                    // Out of file descriptors or a reset during accept: the listener itself
                    // is fine; slow down instead of spinning.
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    tasks.close();
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
