//! Logs (tracing) and the Prometheus `/metrics` endpoint.

use courier_wire::metrics as m;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Log format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// For people: one coloured line per event.
    Text,
    /// One JSON object per line, for log shippers (`LOG_FORMAT=json`).
    Json,
}

impl LogFormat {
    /// `LOG_FORMAT`: `json` or `text` (default). Anything else is an error naming the setting.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("LOG_FORMAT").as_deref() {
            Err(_) | Ok("") | Ok("text") => Ok(LogFormat::Text),
            Ok("json") => Ok(LogFormat::Json),
            Ok(other) => Err(format!("LOG_FORMAT: {other:?} is neither text nor json")),
        }
    }
}

/// Logs on stderr; `RUST_LOG` filters (default: info; rumqttd warnings, minus its
/// per-disconnect routing noise). No log line carries coordinates: the code logs ids, counts
/// and reasons only.
pub fn init_logs(format: LogFormat) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,rumqttd=warn,rumqttd::router::routing=off")
    });
    // Colour codes only for a person at a terminal: in a file or a collector they are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::filter::filter_fn(|meta| {
            !is_broker_span(meta)
        }))
        .with(QuietRouterDrop)
        .with(fmt)
        .try_init();
}

/// rumqttd's router opens an error-level span for every message it receives, formatting the
/// topic into it, so any RUST_LOG that lets its errors through (`warn`) paid for a span per
/// message: about 4% of `run`'s CPU at 60,000 msg/s. Its per-connection spans (client id on its
/// error lines) stay.
fn is_broker_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("rumqttd::router")
}

/// rumqttd 0.20 logs `router-drop` at ERROR whenever its router lets go of a link, and the
/// router does so for every client that sends DISCONNECT: each of our workers at every clean
/// shutdown, so a clean run ended in ERROR lines nobody could act on. The router's own line for
/// the cases that matter (a duplicate client id taking over, a refused publish) carries the
/// cause; `router-drop` only repeats that a link ended, so it is dropped here, and only it.
struct QuietRouterDrop;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for QuietRouterDrop {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR || meta.target() != "rumqttd::server::broker" {
            return true;
        }
        let mut message = Message(false);
        event.record(&mut message);
        !message.0
    }
}

/// Whether an event's message is `router-drop`.
struct Message(bool);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}") == "router-drop";
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = value == "router-drop";
        }
    }
}

/// Installs the process-wide metrics recorder (once) and returns its handle.
pub fn install_recorder() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), m::SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(m::INGEST_BATCH_SIZE.into()),
                        m::BATCH_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(m::HISTORY_BATCH_SIZE.into()),
                        m::HISTORY_BATCH_BUCKETS,
                    )
                })
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

/// One readiness check: a name and whether it holds now.
type Check = (&'static str, Box<dyn Fn() -> bool + Send + Sync>);

/// What `/readyz` asks: every role adds the connections it needs (broker, Redis, PostgreSQL).
#[derive(Default)]
pub struct Readiness {
    checks: std::sync::RwLock<Vec<Check>>,
}

impl Readiness {
    pub fn add(&self, name: &'static str, check: impl Fn() -> bool + Send + Sync + 'static) {
        if let Ok(mut c) = self.checks.write() {
            c.push((name, Box::new(check)));
        }
    }

    /// Ready when at least one check is registered and all hold; the body names each check.
    pub fn report(&self) -> (bool, String) {
        let Ok(checks) = self.checks.read() else {
            return (false, "{\"ready\":false}".into());
        };
        let results: Vec<(&str, bool)> = checks.iter().map(|(n, f)| (*n, f())).collect();
        let ready = !results.is_empty() && results.iter().all(|(_, ok)| *ok);
        let body = results
            .iter()
            .map(|(n, ok)| format!("\"{n}\":{ok}"))
            .collect::<Vec<_>>()
            .join(",");
        (
            ready,
            format!("{{\"ready\":{ready},\"checks\":{{{body}}}}}\n"),
        )
    }
}

/// Serves `/metrics`, `/healthz` (the process answers) and `/readyz` (its connections are up)
/// until `shutdown`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    readiness: std::sync::Arc<Readiness>,
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
        .route("/healthz", get(|| std::future::ready("ok\n")))
        .route(
            "/readyz",
            get(move || {
                let (ready, body) = readiness.report();
                let code = if ready {
                    axum::http::StatusCode::OK
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                };
                std::future::ready((code, [("content-type", "application/json")], body))
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
