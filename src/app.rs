//! `run(config, role, opts, shutdown)`: what a command starts, and the order it stops in.
//! Each role runs as one task; the first that fails stops the others. Roles that serve HTTP
//! hand their routes here, and one server on `HTTP_LISTEN` serves them all.

use crate::broker::{self, BrokerError, CURSOR_JUMPS};
use crate::config::{Broker, Config};
use crate::telemetry;
use courier_auth::Audience;
use fanout::{Fanout, FanoutError};
use history_writer::{AggregateApi, Erasure, HistoryError, HistoryWriter, Trail};
use ingest::{Ingest, IngestError, Stats};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Which roles a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every role, with the embedded broker unless an external one is configured.
    All,
    Ingest,
    Broker,
    /// The history writer and the trail API.
    History,
    /// Orders API (on HTTP_LISTEN) and the viewer gateway (on WS_LISTEN).
    Fanout,
    /// The MQTT edge phones log in to (EDGE_LISTEN ...), forwarding to the bus.
    Edge,
    /// Order events: the relay into the outbox, webhook delivery, the webhooks API.
    Notify,
}

impl Role {
    /// Whether this process runs `other`.
    pub fn runs(self, other: Role) -> bool {
        self == Role::All || self == other
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error("history: {0}")]
    History(#[from] HistoryError),
    #[error(transparent)]
    Keys(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Fanout(#[from] FanoutError),
    #[error(transparent)]
    Edge(#[from] edge::EdgeError),
    #[error("notify: {0}")]
    Notify(#[from] notify::NotifyError),
    #[error("maps: {0}")]
    Web(web::WebError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write LISTEN_REPORT {path}: {source}")]
    ListenReport {
        path: String,
        source: std::io::Error,
    },
    #[error("the broker role needs the embedded broker; unset MQTT_URL")]
    BrokerIsExternal,
    #[error("a role task panicked: {0}")]
    Panicked(String),
}

/// Options of a running process that are not configuration of the pipeline itself.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Print a status line this often (the demo uses 1 s).
    pub status_every: Option<Duration>,
}

/// Binds now, so that a port in use is a start-up error rather than a log line.
fn listener(what: &'static str, addr: SocketAddr) -> Result<tokio::net::TcpListener, AppError> {
    let l = std::net::TcpListener::bind(addr).map_err(|source| AppError::Listen {
        what,
        addr,
        source,
    })?;
    l.set_nonblocking(true)
        .map_err(|source| AppError::Listen { what, addr, source })?;
    tokio::net::TcpListener::from_std(l).map_err(|source| AppError::Listen { what, addr, source })
}

/// Runs `role` until `shutdown`, then stops intake, drains and returns: one start function per
/// role below, each adding its tasks, routes and readiness checks.
pub async fn run(
    mut config: Config,
    role: Role,
    opts: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let handle = telemetry::install_recorder();
    let readiness = Arc::new(telemetry::Readiness::default());
    let mut bound = Listening::default();
    if let Some(addr) = config.metrics_listen {
        let l = listener("metrics", addr)?;
        bound.push("metrics", &l);
        let stop = shutdown.clone();
        let ready = readiness.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve_metrics(l, handle, ready, stop).await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        });
    }

    // Bound before the roles start, so that the pages' and tokens' URLs carry the port really
    // bound (HTTP_LISTEN may name port 0). Every role listed serves routes or fails to start.
    let http = match role {
        Role::All | Role::History | Role::Fanout | Role::Notify => {
            let l = listener("http", config.http_listen)?;
            config.http_listen = l.local_addr().unwrap_or(config.http_listen);
            Some(l)
        }
        Role::Ingest | Role::Broker | Role::Edge => None,
    };
    let edge_stats = Arc::new(edge::Stats::default());
    let courier_keys = config.verifier(
        Audience::Courier,
        "the edge checks the couriers' device tokens with it",
    );
    let cx = Ctx {
        config: &config,
        role,
        shutdown: &shutdown,
        readiness: &readiness,
    };
    let mut phones = bind_edge(&cx, courier_keys, &edge_stats)?;
    start_broker(&cx, &mut phones, &mut bound)?;
    let stats = Arc::new(Stats::default());
    let history_stats = Arc::new(history_writer::Stats::default());
    if let Some(every) = opts.status_every {
        let history = role.runs(Role::History).then(|| history_stats.clone());
        let edge = phones.is_some().then(|| edge_stats.clone());
        tokio::spawn(status_line(
            stats.clone(),
            history,
            edge,
            every,
            shutdown.clone(),
        ));
    }

    let mut tasks = Tasks {
        roles: JoinSet::new(),
        routes: Vec::new(),
        bound,
    };
    if role.runs(Role::History) {
        start_history(&cx, &mut tasks, &history_stats)?;
    }
    if role.runs(Role::Ingest) {
        start_ingest(&cx, &mut tasks, &stats);
    }
    if role.runs(Role::Fanout) {
        start_fanout(&cx, &mut tasks).await?;
    }
    if role.runs(Role::Notify) {
        start_notify(&cx, &mut tasks)?;
    }
    if let Some(edge) = phones {
        start_edge(&cx, &mut tasks, edge, &edge_stats);
    }
    // The maps ride along with the roles that serve HTTP (they need no worker of their own).
    if !tasks.routes.is_empty() && config.web.enabled {
        start_maps(&cx, &mut tasks, &handle).await?;
    }
    if let (false, Some(l)) = (tasks.routes.is_empty(), http) {
        start_http(&cx, &mut tasks, l)?;
    }
    if let Some(path) = &config.listen_report {
        tasks.bound.write(path)?;
    }
    let mut roles = tasks.roles;
    if roles.is_empty() {
        // The broker alone: it runs on its own threads until the process ends.
        shutdown.cancelled().await;
        return Ok(());
    }

    let mut first_error = None;
    while let Some(joined) = roles.join_next().await {
        let result = joined
            .map_err(|e| AppError::Panicked(e.to_string()))
            .and_then(|r| r);
        if let Err(e) = result {
            tracing::error!(error = %e, "role failed; stopping the others");
            shutdown.cancel();
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// What every start function reads: the settings, the role asked for, the shutdown signal and
/// the readiness checks it adds to.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    config: &'a Config,
    role: Role,
    shutdown: &'a CancellationToken,
    readiness: &'a telemetry::Readiness,
}

/// What the start functions add: the roles' tasks, the HTTP routes served together and the
/// addresses bound.
struct Tasks {
    roles: JoinSet<Result<(), AppError>>,
    routes: Vec<axum::Router>,
    bound: Listening,
}

/// The addresses this process really listens on, by name (`metrics`, `http`, `ws`, `broker`,
/// `broker.tls`, `edge.tcp`, `edge.tls`, `edge.ws`), for `LISTEN_REPORT`.
#[derive(Debug, Default)]
struct Listening(Vec<(String, SocketAddr)>);

impl Listening {
    fn push(&mut self, name: &str, l: &tokio::net::TcpListener) {
        if let Ok(addr) = l.local_addr() {
            self.add(name, addr);
        }
    }

    fn add(&mut self, name: &str, addr: SocketAddr) {
        self.0.push((name.to_string(), addr));
    }

    /// One `name=address` line each, in the order bound.
    fn get(&self, name: &str) -> Option<SocketAddr> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    fn lines(&self) -> String {
        self.0.iter().map(|(n, a)| format!("{n}={a}\n")).collect()
    }

    /// Writes the report whole: into a file beside it, renamed over `path`, so that a reader
    /// never sees half of it.
    fn write(&self, path: &std::path::Path) -> Result<(), AppError> {
        let fail = |source| AppError::ListenReport {
            path: path.display().to_string(),
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, self.lines()).map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)
    }
}

/// The edge binds first: a port in use is a start-up error before anything else runs.
fn bind_edge(
    cx: &Ctx<'_>,
    courier_keys: Result<&courier_auth::Verifier, crate::config::ConfigError>,
    edge_stats: &Arc<edge::Stats>,
) -> Result<Option<edge::Bound>, AppError> {
    let Ctx { config, role, .. } = *cx;
    Ok(match (role, courier_keys) {
        (Role::All | Role::Edge, Ok(keys)) => {
            let bound = edge::Edge {
                settings: config.edge.clone(),
                keys: keys.clone(),
                stats: edge_stats.clone(),
            }
            .bind();
            match bound {
                Ok(b) => Some(b),
                // `run` starts what is configured; asked for by name, the edge needs a listener.
                Err(edge::EdgeError::NoListener) if role == Role::All => {
                    tracing::info!("edge not started: EDGE_LISTEN is off");
                    None
                }
                Err(e) => return Err(e.into()),
            }
        }
        (Role::Edge, Err(e)) => return Err(e.into()),
        (Role::All, Err(e)) => {
            tracing::warn!("edge not started (phones cannot connect): {e}");
            None
        }
        _ => None,
    })
}

/// The embedded bus broker, for `run` and `broker` unless MQTT_URL names another.
fn start_broker(
    cx: &Ctx<'_>,
    phones: &mut Option<edge::Bound>,
    bound: &mut Listening,
) -> Result<(), AppError> {
    let Ctx {
        config, readiness, ..
    } = *cx;
    let role = cx.role;
    match (&config.broker, role) {
        (
            Broker::Embedded {
                listen,
                config: file,
                tls,
                auth,
            },
            Role::All | Role::Broker,
        ) => {
            let mut bc = broker::load_config(file.as_deref(), *listen)?;
            let keys = match auth {
                true => Some(config.verifier(Audience::Bus, "the embedded broker checks the workers' bus tokens with it (or set MQTT_ALLOW_ANONYMOUS=true, for development only)")?.clone()),
                false => None,
            };
            broker::secure(&mut bc, tls.as_ref(), keys)?;
            // The edge of this process hands points to rumqttd in-process.
            match phones.as_mut().and_then(|p| p.take_queue()) {
                Some(queue) => broker::start_with_edge(bc, *listen, queue)?,
                None => broker::start(bc, *listen)?,
            }
            readiness.add("broker", || true);
            bound.add("broker", *listen);
            if let Some(t) = tls {
                bound.add("broker.tls", t.listen);
            }
            match tls {
                Some(t) => {
                    tracing::info!(%listen, tls = %t.listen, logins = *auth, "embedded broker listening")
                }
                None => tracing::info!(%listen, logins = *auth, "embedded broker listening"),
            }
            if !*auth {
                tracing::warn!("embedded broker admits anonymous clients: development only");
            }
        }
        (Broker::External(_), Role::Broker) => return Err(AppError::BrokerIsExternal),
        _ => {}
    }
    Ok(())
}

/// The history writer, with the trail, aggregates and erasure APIs.
fn start_history(
    cx: &Ctx<'_>,
    tasks: &mut Tasks,
    history_stats: &Arc<history_writer::Stats>,
) -> Result<(), AppError> {
    let Ctx {
        config,
        shutdown,
        readiness,
        ..
    } = *cx;
    let keys = config
        .verifier(
            Audience::Trail,
            "the trail API checks support staff's tokens with it",
        )?
        .clone();
    let clock = history_writer::system_clock();
    let optional = |aud| config.auth.as_ref().and_then(|k| k.verifier(aud)).cloned();
    let mut trail = Trail::new(
        &config.database_url,
        keys.clone(),
        &config.history,
        clock.clone(),
    )?;
    match optional(Audience::Courier) {
        Some(k) => trail = trail.with_courier_keys(k),
        None => tracing::info!("no courier.pub: couriers' own-trail (access) not served"),
    }
    if let Some(k) = optional(Audience::Ops) {
        trail = trail.with_ops_keys(k);
    }
    tasks.routes.push(trail.router());
    tasks
        .routes
        .push(AggregateApi::new(&config.database_url, keys, clock.clone()).router());
    match optional(Audience::Privacy) {
        Some(k) => tasks.routes.push(
            Erasure::new(
                &config.database_url,
                &config.redis,
                config.keys.clone(),
                k,
                clock.clone(),
            )?
            .router(),
        ),
        None => tracing::info!("no privacy.pub: the erasure API is not served"),
    }
    let writer = HistoryWriter {
        config: config.history.clone(),
        mqtt: config.worker_endpoint("history"),
        database_url: config.database_url.clone(),
        redis: config.redis.clone(),
        keys: config.keys.clone(),
        validation: config.ingest.validation(),
        stats: history_stats.clone(),
        clock,
    };
    let (m, p) = (history_stats.clone(), history_stats.clone());
    readiness.add("history.mqtt", move || m.mqtt_up.get());
    readiness.add("history.postgres", move || p.pg_up.get());
    tracing::info!(group = %config.history.group, "history writer starting");
    let stop = shutdown.clone();
    tasks
        .roles
        .spawn(async move { Ok(writer.run(stop).await?) });
    Ok(())
}

/// Ingest: the live index in Redis.
fn start_ingest(cx: &Ctx<'_>, tasks: &mut Tasks, stats: &Arc<Stats>) {
    let Ctx {
        config,
        shutdown,
        readiness,
        ..
    } = *cx;
    let ingest = Ingest {
        config: config.ingest.clone(),
        mqtt: config.worker_endpoint("ingest"),
        redis: config.redis.clone(),
        keys: config.keys.clone(),
        stats: stats.clone(),
    };
    let (m, r) = (stats.clone(), stats.clone());
    readiness.add("ingest.mqtt", move || m.mqtt_up.get());
    readiness.add("ingest.redis", move || r.redis_up.get());
    tracing::info!(workers = config.ingest.workers, group = %config.ingest.group, redis = %config.redis, "ingest starting");
    let stop = shutdown.clone();
    tasks
        .roles
        .spawn(async move { Ok(ingest.run(stop).await?) });
}

/// Fanout: the orders API and the viewer gateway (needs SERVICE_KEY and the viewer keys).
async fn start_fanout(cx: &Ctx<'_>, tasks: &mut Tasks) -> Result<(), AppError> {
    let Ctx {
        config,
        role,
        shutdown,
        readiness,
    } = *cx;
    let fanout_stats = Arc::new(fanout::Stats::default());
    let why = "the orders API mints tracking tokens and the viewer gateway checks them";
    let keys = config
        .signer(Audience::Viewer, why)
        .and_then(|s| Ok((s, config.verifier(Audience::Viewer, why)?)));
    match (keys, config.fanout.service_key.is_some()) {
        (Ok((signer, verifier)), true) => {
            // Bound first: the tokens' default WebSocket URL carries the port really bound.
            let l = listener("ws", config.ws_listen)?;
            let ws_listen = l.local_addr().unwrap_or(config.ws_listen);
            tasks.bound.add("ws", ws_listen);
            let mut fanout_config = config.fanout.clone();
            if config.web.enabled {
                fanout_config.tracking_page_url = Some(page_url(config));
            }
            let fanout = Fanout {
                config: fanout_config,
                mqtt: config.worker_endpoint("fanout"),
                redis: config.redis.clone(),
                keys: config.keys.clone(),
                signer: signer.clone(),
                verifier: verifier.clone(),
                ws_listen,
                stats: fanout_stats.clone(),
            }
            .prepare()
            .await?;
            tasks.routes.push(fanout.router());
            let m = fanout_stats.clone();
            readiness.add("fanout.mqtt", move || m.mqtt_up.get());
            tracing::info!(ws = %ws_listen, "fanout viewer gateway listening");
            let stop = shutdown.clone();
            tasks
                .roles
                .spawn(async move { Ok(fanout.run(l, stop).await?) });
        }
        // `run` starts what is configured; asked for by name, fanout needs its keys.
        (Err(e), _) if role == Role::All => tracing::warn!("fanout not started: {e}"),
        _ if role == Role::All => {
            tracing::warn!("fanout not started: set SERVICE_KEY")
        }
        (Err(e), _) => return Err(e.into()),
        (_, false) => {
            return Err(
                FanoutError::Config("SERVICE_KEY is required by the fanout role".into()).into(),
            )
        }
    }
    Ok(())
}

/// Notify: order events to the outbox, signed webhooks, the webhooks API.
fn start_notify(cx: &Ctx<'_>, tasks: &mut Tasks) -> Result<(), AppError> {
    let Ctx {
        config,
        role,
        shutdown,
        ..
    } = *cx;
    match &config.fanout.service_key {
        Some(key) => {
            let n = notify::Notify {
                config: config.notify.clone(),
                redis: config.redis.clone(),
                database_url: config.database_url.clone(),
                keys: config.keys.clone(),
                stats: Arc::new(notify::Stats::default()),
            };
            tasks.routes.push(n.router(key.clone()));
            tracing::info!(group = %config.notify.group, "notify (order events, webhooks) starting");
            let stop = shutdown.clone();
            tasks.roles.spawn(async move { Ok(n.run(stop).await?) });
        }
        None if role == Role::All => {
            tracing::warn!("notify not started: set SERVICE_KEY")
        }
        None => {
            return Err(notify::NotifyError::Config(
                "SERVICE_KEY is required by the notify role (its webhooks API)".into(),
            )
            .into())
        }
    }
    Ok(())
}

/// The edge's sessions, forwarding to the bus (in-process inside `run`).
fn start_edge(cx: &Ctx<'_>, tasks: &mut Tasks, edge: edge::Bound, edge_stats: &Arc<edge::Stats>) {
    let Ctx {
        config,
        role,
        shutdown,
        readiness,
    } = *cx;
    // Without the in-process link (an external bus, or `courier-pipeline edge`), the edge
    // forwards over MQTT with a service login.
    let bus = config.worker_endpoint("edge");
    if role == Role::Edge && bus.password.is_none() {
        tracing::warn!("the edge has no bus login (the bus must then admit anonymous clients): set MQTT_TOKEN, e.g. from `courier-pipeline token bus --role edge`");
    }
    let bus = Some(bus);
    let up = edge_stats.clone();
    readiness.add("edge.bus", move || up.bus_up.get());
    for (via, addr) in edge.local_addrs() {
        tracing::info!(%addr, transport = via.label(), "edge listening for phones");
        tasks.bound.add(&format!("edge.{}", via.label()), addr);
    }
    let stop = shutdown.clone();
    tasks
        .roles
        .spawn(async move { Ok(edge.run(bus, stop).await?) });
}

/// The live maps (`/ops`, `/track/...`), on the HTTP listener of the roles that serve one.
async fn start_maps(
    cx: &Ctx<'_>,
    tasks: &mut Tasks,
    handle: &metrics_exporter_prometheus::PrometheusHandle,
) -> Result<(), AppError> {
    let config = cx.config;
    let key = |aud| config.auth.as_ref().and_then(|k| k.verifier(aud)).cloned();
    let ops_keys = key(Audience::Ops);
    if ops_keys.is_none() {
        tracing::warn!("no ops.pub: the operations map refuses everyone");
    }
    let metrics_text = handle.clone();
    let maps = web::Web {
        config: config.web.clone(),
        redis: config.redis.clone(),
        keys: config.keys.clone(),
        ops_keys,
        viewer_keys: key(Audience::Viewer),
        evict_after: config.ingest.evict_after,
        ws_url: config.fanout.public_ws_url.clone().unwrap_or_else(|| {
            // The gateway of this process, at the port it really bound, else the configured one.
            let ws = tasks.bound.get("ws").unwrap_or(config.ws_listen);
            format!("ws://{ws}{}", fanout::PATH)
        }),
        metrics: Some(Arc::new(move || metrics_text.render())),
    };
    tasks
        .routes
        .push(maps.router().await.map_err(AppError::Web)?);
    tracing::info!(ops = %format!("{}/ops", page_url(config)), "live maps served");
    Ok(())
}

/// The one HTTP listener of the process, serving every role's routes.
fn start_http(cx: &Ctx<'_>, tasks: &mut Tasks, l: tokio::net::TcpListener) -> Result<(), AppError> {
    let Ctx {
        config, shutdown, ..
    } = *cx;
    let http_listen = config.http_listen;
    if let Some(keys) = &config.auth {
        tasks.routes.push(jwks_route(keys));
    }
    tasks.bound.push("http", &l);
    let app = tasks
        .routes
        .drain(..)
        .fold(axum::Router::new(), axum::Router::merge);
    let stop = shutdown.clone();
    tasks.roles.spawn(async move {
        crate::http::serve(l, app, crate::http::HttpLimits::default(), stop)
            .await
            .map_err(|source| AppError::Listen {
                what: "http",
                addr: http_listen,
                source,
            })
    });
    Ok(())
}

/// One line per period: rates and totals, no coordinates.
async fn status_line(
    stats: Arc<Stats>,
    history: Option<Arc<history_writer::Stats>>,
    edge: Option<Arc<edge::Stats>>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    let mut last = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let received = stats.received.load(Relaxed);
        let history = history.as_ref().map_or(String::new(), |h| {
            format!(
                " | history written {} dropped {} buffered {}",
                h.written.load(Relaxed),
                h.dropped_total(),
                h.buffer_depth.load(Relaxed)
            )
        });
        let edge = edge.as_ref().map_or(String::new(), |e| {
            format!(
                "phones {} (refused {}, rate-limited {}) | ",
                e.connected.load(Relaxed),
                e.refused_total(),
                e.rate_limited.load(Relaxed)
            )
        });
        println!(
            "status: {edge}in {:>7.0}/s | accepted {} stale {} invalid {} | tracks {} | queue drops {} | redis errors {} | evicted {} | broker loss alerts {}{history}",
            (received - last) as f64 / every.as_secs_f64(),
            stats.accepted.load(Relaxed),
            stats.stale.load(Relaxed),
            stats.invalid.load(Relaxed),
            stats.tracks_published.load(Relaxed),
            stats.queue_dropped.load(Relaxed),
            stats.errors.load(Relaxed),
            stats.evicted_silent.load(Relaxed) + stats.evicted_offline.load(Relaxed),
            CURSOR_JUMPS.load(Relaxed),
        );
        last = received;
    }
}

/// Where customers and ops staff reach the maps: `web.public_url`, else `http://<HTTP_LISTEN>`.
fn page_url(config: &Config) -> String {
    config
        .web
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.http_listen))
}

/// `/.well-known/jwks.json`: the public keys this process accepts (RFC 7517), so that other
/// verifiers (an API gateway, a broker's JWT authentication) check the same tokens.
fn jwks_route(keys: &courier_auth::KeySet) -> axum::Router {
    let doc = keys.jwks().to_string();
    axum::Router::new().route(
        "/.well-known/jwks.json",
        axum::routing::get(move || {
            let doc = doc.clone();
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/jwk-set+json")],
                    doc,
                )
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_report_is_one_line_per_listener_written_whole() {
        let mut bound = Listening::default();
        bound.add("metrics", "127.0.0.1:9464".parse().unwrap());
        bound.add("edge.tcp", "127.0.0.1:40001".parse().unwrap());
        bound.add("edge.tcp", "[::1]:40002".parse().unwrap());
        assert_eq!(
            bound.lines(),
            "metrics=127.0.0.1:9464\nedge.tcp=127.0.0.1:40001\nedge.tcp=[::1]:40002\n"
        );
        assert_eq!(
            bound.get("edge.tcp"),
            Some("127.0.0.1:40001".parse().unwrap())
        );
        assert_eq!(bound.get("ws"), None);
        let dir = std::env::temp_dir().join(format!("report-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("listen");
        bound.write(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), bound.lines());
        // Nothing left beside it.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A directory that does not exist: an error naming the file, not a panic.
        let err = bound.write(&dir.join("none/listen")).unwrap_err();
        assert!(err.to_string().contains("LISTEN_REPORT"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
