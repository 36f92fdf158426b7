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
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, HeaderValue, StatusCode};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// WebSocket path of the gateway.
pub const PATH: &str = "/mqtt";
/// The WebSocket subprotocol MQTT clients ask for.
pub const SUBPROTOCOL: &str = "mqtt";

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

/// The WebSocket handshake check: path `/mqtt`, subprotocol `mqtt` offered (and chosen). The
/// large error type is tungstenite's callback signature.
#[allow(clippy::result_large_err)]
pub(crate) fn check_upgrade(req: &Request, mut resp: Response) -> Result<Response, ErrorResponse> {
    let refuse = |status: StatusCode, why: &str| {
        let mut r = ErrorResponse::new(Some(why.to_string()));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != PATH {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "not found: the gateway is on /mqtt",
        ));
    }
    let offers_mqtt = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(SUBPROTOCOL));
    if !offers_mqtt {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "the WebSocket subprotocol must be mqtt",
        ));
    }
    resp.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, proto: Option<&str>) -> Request {
        let mut b = Request::builder().uri(path);
        if let Some(p) = proto {
            b = b.header(header::SEC_WEBSOCKET_PROTOCOL, p);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn upgrade_needs_the_path_and_the_mqtt_subprotocol() {
        let ok = check_upgrade(&req("/mqtt", Some("mqttv3.1, mqtt")), Response::new(())).unwrap();
        assert_eq!(ok.headers()[header::SEC_WEBSOCKET_PROTOCOL], "mqtt");
        assert_eq!(
            check_upgrade(&req("/", Some("mqtt")), Response::new(()))
                .unwrap_err()
                .status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            check_upgrade(&req("/mqtt", None), Response::new(()))
                .unwrap_err()
                .status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            check_upgrade(&req("/mqtt", Some("chat")), Response::new(()))
                .unwrap_err()
                .status(),
            StatusCode::BAD_REQUEST
        );
    }
}
