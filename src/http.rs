//! The HTTP listener of the APIs (orders, trail) on `HTTP_LISTEN`, bounded against slow and
//! greedy clients: `axum::serve` sets no timeouts, so one idle connection per file descriptor
//! (slowloris) could hold the process. Served here on hyper's HTTP/1 connection builder with:
//!
//! | bound | default | on breach |
//! |---|---|---|
//! | request headers must arrive within | 10 s | the connection is closed |
//! | a request (handler included) must finish within | 30 s | 503 |
//! | request body | 64 KiB | 413 |
//! | connections at once | 1,024 | more wait in the kernel's backlog (not accepted) |

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bounds of the HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_body_bytes: usize,
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 64 * 1024,
            max_connections: 1024,
        }
    }
}

/// Serves `app` on `listener` until `shutdown`; then lets requests in progress finish (each
/// within its request timeout) and returns.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: HttpLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let timeout = limits.request_timeout;
    let app = app
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| request_timeout(timeout, req, next),
        ));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let tasks = TaskTracker::new();
    loop {
        // A permit before accepting: past the cap, connections wait in the backlog and hold no
        // descriptor of ours.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        };
        let service = TowerToHyperService::new(app.clone());
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    tasks.close();
    let _ = tokio::time::timeout(limits.request_timeout, tasks.wait()).await;
    Ok(())
}

async fn request_timeout(limit: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => courier_wire::ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the request took too long",
        )
        .into_response(),
    }
}
