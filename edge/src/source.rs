//! The listeners phones connect to, and their accept loops. Handshakes (TLS, WebSocket) run in
//! each connection's own task under the connect deadline, never in the accept loop, so one idle
//! TCP connection cannot delay anyone else's login. Each transport spawns its own task type: a
//! plain TCP session does not carry a TLS session's (much larger) state.

use crate::events::Via;
use crate::policy::Refusal;
use crate::session::{self, PendingSlot, Shared};
use crate::transport::{check_upgrade, ws_config, Stream, Tcp, Ws};
use crate::{EdgeError, TlsFiles};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What a listener speaks.
#[derive(Clone)]
pub(crate) enum Kind {
    Tcp,
    Tls(TlsAcceptor),
    Ws,
}

/// Binds `addr` now (a port in use is a start-up error), with SO_REUSEPORT when asked so that
/// several edge processes share the port.
pub(crate) fn bind(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, EdgeError> {
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
    // A deep backlog: after an edge restart every phone reconnects at once.
    s.listen(8192).map_err(listen)?;
    TcpListener::from_std(s.into()).map_err(listen)
}

/// rustls server configuration from PEM files (ring provider, no client certificates).
pub(crate) fn tls_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, EdgeError> {
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
pub(crate) async fn accept(
    sh: Arc<Shared>,
    listener: TcpListener,
    kind: Kind,
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
                    tracing::warn!(error = %e, "edge accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        };
        let Some(slot) = PendingSlot::take(&sh) else {
            sh.metrics.refused(&sh.stats, Refusal::Full);
            continue;
        };
        let deadline = Instant::now() + sh.settings.connect_timeout;
        let (sh, stop) = (sh.clone(), shutdown.clone());
        match &kind {
            Kind::Tcp => {
                tasks.spawn(session::serve(
                    sh,
                    Tcp(stream),
                    Via::Tcp,
                    slot,
                    deadline,
                    stop,
                ));
            }
            Kind::Tls(acceptor) => {
                let acceptor = acceptor.clone();
                tasks.spawn(async move {
                    match timeout_at(deadline, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            session::serve(sh, Stream(tls), Via::Tls, slot, deadline, stop).await
                        }
                        _ => sh.metrics.refused(&sh.stats, Refusal::Tls),
                    }
                });
            }
            Kind::Ws => {
                let max = sh.settings.max_packet_bytes;
                tasks.spawn(async move {
                    let upgrade = tokio_tungstenite::accept_hdr_async_with_config(
                        stream,
                        check_upgrade,
                        Some(ws_config(max)),
                    );
                    match timeout_at(deadline, upgrade).await {
                        Ok(Ok(ws)) => {
                            session::serve(sh, Ws::new(ws), Via::Ws, slot, deadline, stop).await
                        }
                        _ => sh.metrics.refused(&sh.stats, Refusal::WebSocket),
                    }
                });
            }
        }
    }
}
