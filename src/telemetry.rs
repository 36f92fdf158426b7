//! Logs (tracing) and the Prometheus `/metrics` endpoint.

use courier_wire::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Human-readable logs on stderr; `RUST_LOG` filters (default: info; rumqttd warnings, minus its per-disconnect routing noise).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rumqttd=warn,rumqttd::router::routing=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Installs the process-wide metrics recorder (once) and returns its handle.
pub fn install_recorder() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), m::SECONDS_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(m::INGEST_BATCH_SIZE.into()), m::BATCH_BUCKETS))
                .expect("bucket lists are non-empty constants");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may exist already (tests in one process); this handle then
            // renders an empty page, which is harmless.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Serves `/metrics` and `/healthz` until `shutdown`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::{routing::get, Router};
    let upkeep = handle.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => upkeep.run_upkeep(),
            }
        }
    });
    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/healthz", get(|| std::future::ready("ok\n")));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
