//! The maps' routes. Pages and bundles are public (they hold no data); every data route checks
//! a bearer token first and answers one generic 401 to anything else, before reading Redis:
//!
//! | route | token | answer |
//! |---|---|---|
//! | `GET /ops`, `GET /track/{order}`, `GET /maps/assets/{file}` | none | the page / bundle |
//! | `GET /ops/api/live?bbox=w,s,e,n[&cols=N]` | `ops` | [`View`]: markers, or clusters past `web.max_markers` (N columns, at most `web.cluster_columns`) |
//! | `GET /ops/api/couriers/{id}` | `ops` | a courier's card: last seen, position, order, seq state |
//! | `GET /ops/api/totals` | `ops` | live couriers, accepted points/s, loss counters |
//! | `GET /track/{order}/status` | `viewer` for that order | `{"running": bool}` |
//!
//! A refresh is one or two Redis round trips: `GEOSEARCH ... BYBOX ... WITHHASH COUNT
//! max_scan ANY`, then (when the view is drawn courier by courier) one pipeline of `ZMSCORE`
//! on `couriers:seen` and `HMGET` on `courier:order` for those couriers. Coordinates are
//! never logged.

use crate::assets;
use crate::config::WebConfig;
use crate::error::WebError;
use crate::live::{cluster, decode_geohash, Ages, Bbox, Cluster, Marker, View};
use crate::totals;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use courier_auth::{Claims, Verifier};
use courier_wire::metrics as m;
use courier_wire::seq_state::SeqState;
use courier_wire::{ApiError, Keys, RedisConn, RedisOptions, RedisTarget};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The pipeline's metrics as Prometheus text (the process's own recorder).
pub type MetricsText = Arc<dyn Fn() -> String + Send + Sync>;

/// What the maps need; [`Web::router`] connects to Redis and returns the routes.
pub struct Web {
    pub config: WebConfig,
    pub redis: RedisTarget,
    pub keys: Keys,
    /// The ops audience's public keys; `None`: `/ops/api` refuses everyone.
    pub ops_keys: Option<Verifier>,
    /// The viewer audience's public keys, for `/track/{order}/status`.
    pub viewer_keys: Option<Verifier>,
    /// `ingest.evict_after`: when a silent courier leaves the live index.
    pub evict_after: Duration,
    /// The viewer gateway's WebSocket URL the tracking page connects to.
    pub ws_url: String,
    /// Read for the totals; `None`: only the live count is shown.
    pub metrics: Option<MetricsText>,
}

struct Shared {
    config: WebConfig,
    redis: RedisConn,
    keys: Keys,
    ops_keys: Option<Verifier>,
    viewer_keys: Option<Verifier>,
    ages: Ages,
    metrics: Option<MetricsText>,
    /// The last (time, accepted points) reading, for points/s.
    last_accepted: Mutex<Option<(f64, f64, Option<f64>)>>,
    ops_html: (String, String),
    track_html: (String, String),
    csp: String,
}

type S = Arc<Shared>;

impl Web {
    pub async fn router(self) -> Result<Router, WebError> {
        self.config
            .validate()
            .map_err(|e| WebError::Config(e.to_string()))?;
        let redis = RedisConn::connect(&self.redis, &RedisOptions::default()).await?;
        let c = &self.config;
        let page = json!({
            "tile_url": c.tile_url,
            "tile_attribution": c.tile_attribution,
            "refresh_ms": c.refresh.as_millis() as u64,
            "max_markers": c.max_markers,
            "late_after": c.late_after.as_secs_f64(),
            "evict_after": self.evict_after.as_secs_f64(),
            "ws_url": self.ws_url,
        });
        let ops = assets::render(assets::OPS_HTML, &page);
        let track = assets::render(assets::TRACK_HTML, &page);
        let csp = csp(c.tile_url.as_deref(), &self.ws_url);
        let shared = Arc::new(Shared {
            ages: Ages {
                late_after: c.late_after.as_secs_f64(),
                evict_after: self.evict_after.as_secs_f64(),
                evict_warning: c.evict_warning.as_secs_f64(),
            },
            ops_html: (assets::etag(ops.as_bytes()), ops),
            track_html: (assets::etag(track.as_bytes()), track),
            csp,
            config: self.config,
            redis,
            keys: self.keys,
            ops_keys: self.ops_keys,
            viewer_keys: self.viewer_keys,
            metrics: self.metrics,
            last_accepted: Mutex::new(None),
        });
        Ok(Router::new()
            .route("/ops", get(ops_page))
            .route("/track/{order}", get(track_page))
            .route("/maps/assets/{file}", get(bundle))
            .route("/ops/api/live", get(live))
            .route("/ops/api/couriers/{id}", get(card))
            .route("/ops/api/totals", get(totals_route))
            .route("/track/{order}/status", get(track_status))
            .with_state(shared))
    }
}

/// The pages may load scripts and styles from here only, images from here and the tile
/// server, and connect here and to the viewer gateway.
fn csp(tile_url: Option<&str>, ws_url: &str) -> String {
    let origin = |u: &str| {
        let (scheme, rest) = u.split_once("://")?;
        let host = rest.split('/').next()?;
        Some(format!("{scheme}://{}", host.replace("{s}", "*")))
    };
    let tiles = tile_url.and_then(origin).unwrap_or_default();
    let ws = origin(ws_url).unwrap_or_default();
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data: {tiles}; connect-src 'self' {ws}; frame-ancestors 'none'; \
         base-uri 'none'; form-action 'none'"
    )
}

async fn ops_page(State(s): State<S>, headers: HeaderMap) -> Response {
    page(&s, &s.ops_html, &headers)
}

async fn track_page(State(s): State<S>, headers: HeaderMap) -> Response {
    page(&s, &s.track_html, &headers)
}

fn page(s: &Shared, (etag, html): &(String, String), headers: &HeaderMap) -> Response {
    assets::serve(
        headers,
        "text/html; charset=utf-8",
        "no-cache",
        etag,
        html.clone(),
        &[(header::CONTENT_SECURITY_POLICY, s.csp.clone())],
    )
}

async fn bundle(Path(file): Path<String>, headers: HeaderMap) -> Response {
    match assets::find(&file) {
        Some(a) => assets::serve(
            &headers,
            a.content_type,
            "public, max-age=3600",
            &assets::etag(a.bytes),
            a.bytes,
            &[],
        ),
        None => refusal(StatusCode::NOT_FOUND, "no such file"),
    }
}

/// The answer every API refuses with ([`ApiError`]), with the pages' own headers.
fn refusal(status: StatusCode, message: &str) -> Response {
    let mut r = ApiError::new(status, message).into_response();
    assets::common_headers(r.headers_mut());
    r
}

fn count(route: &'static str, result: &'static str) {
    metrics::counter!(m::WEB_REQUESTS, "route" => route, "result" => result).increment(1);
}

/// The bearer's claims under `keys`; the reason of a refusal goes to the log, the caller gets
/// one generic 401 (why a token failed would help forge the next).
fn bearer(
    headers: &HeaderMap,
    keys: Option<&Verifier>,
    route: &'static str,
) -> Result<Claims, Unauthorized> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(courier_auth::bearer_credential);
    let now = courier_wire::clock::unix_now().max(0.0) as u64;
    let result = match (token, keys) {
        (None, _) => Err("missing"),
        (Some(_), None) => Err("not_configured"),
        (Some(t), Some(k)) => k.verify(t, now).map_err(|e| e.label()),
    };
    result.map_err(|reason| {
        count(route, "unauthorized");
        tracing::info!(route, reason, "maps request refused: token");
        Unauthorized
    })
}

/// The generic 401 of [`bearer`].
struct Unauthorized;

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        refusal(StatusCode::UNAUTHORIZED, "a valid bearer token is required")
    }
}

fn redis_failed(route: &'static str, e: redis::RedisError) -> Response {
    count(route, "error");
    tracing::warn!(route, error = %e, "maps: redis call failed");
    refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "the live index is unavailable; retry",
    )
}

fn ok(route: &'static str, body: impl serde::Serialize) -> Response {
    count(route, "ok");
    let mut r = Json(body).into_response();
    assets::common_headers(r.headers_mut());
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn live(
    State(s): State<S>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    const R: &str = "live";
    if let Err(r) = bearer(&headers, s.ops_keys.as_ref(), R) {
        return r.into_response();
    }
    let bbox = match Bbox::parse(q.get("bbox").map(String::as_str).unwrap_or("")) {
        Ok(b) => b,
        Err(why) => {
            count(R, "bad_request");
            return refusal(StatusCode::BAD_REQUEST, why);
        }
    };
    // The page asks for a grid that fits its width (about 64 px a cell); the setting caps it.
    let columns = q
        .get("cols")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(s.config.cluster_columns)
        .clamp(4, s.config.cluster_columns);
    match read_view(&s, &bbox, columns).await {
        Ok(v) => ok(R, v),
        Err(e) => redis_failed(R, e),
    }
}

/// Six decimals (0.1 m) are all a map shows; the full 17 digits would add a third to the bytes.
fn micro(deg: f64) -> f64 {
    (deg * 1e6).round() / 1e6
}

/// One refresh: the couriers in `bbox`, as markers or clusters.
async fn read_view(s: &Shared, bbox: &Bbox, columns: usize) -> Result<View, redis::RedisError> {
    let mut conn = s.redis.clone();
    let (lon, lat, w, h) = bbox.search_box();
    let found: Vec<(String, u64)> = redis::cmd("GEOSEARCH")
        .arg(&s.keys.live)
        .arg("FROMLONLAT")
        .arg(lon)
        .arg(lat)
        .arg("BYBOX")
        .arg(w)
        .arg(h)
        .arg("m")
        .arg("WITHHASH")
        .arg("COUNT")
        .arg(s.config.max_scan)
        .arg("ANY")
        .query_async(&mut conn)
        .await?;
    let truncated = found.len() >= s.config.max_scan;
    let inside: Vec<(String, f64, f64)> = found
        .into_iter()
        .map(|(id, hash)| {
            let (lat, lon) = decode_geohash(hash);
            (id, lat, lon)
        })
        .filter(|(_, lat, lon)| bbox.contains(*lat, *lon))
        .collect();
    let now = courier_wire::clock::unix_now();
    let mut view = View {
        now,
        in_view: inside.len(),
        truncated,
        markers: Vec::new(),
        clusters: Vec::new(),
    };
    if inside.len() > s.config.max_markers {
        let pts: Vec<(f64, f64)> = inside.iter().map(|(_, lat, lon)| (*lat, *lon)).collect();
        view.clusters = cluster(&pts, bbox, columns)
            .into_iter()
            .map(|c| Cluster(micro(c.0), micro(c.1), c.2))
            .collect();
        return Ok(view);
    }
    if inside.is_empty() {
        return Ok(view);
    }
    let ids: Vec<&str> = inside.iter().map(|(id, _, _)| id.as_str()).collect();
    let (seen, orders): (Vec<Option<f64>>, Vec<Option<String>>) = redis::pipe()
        .cmd("ZMSCORE")
        .arg(&s.keys.seen)
        .arg(&ids)
        .cmd("HMGET")
        .arg(&s.keys.order)
        .arg(&ids)
        .query_async(&mut conn)
        .await?;
    view.markers = inside
        .into_iter()
        .zip(seen)
        .zip(orders)
        .map(|(((id, lat, lon), seen), order)| {
            // A member of live without a seen time is about to be swept: draw it as such.
            let age = seen.map_or(f64::INFINITY, |t| (now - t).max(0.0));
            let shown = if age.is_finite() {
                (age * 10.0).round() / 10.0
            } else {
                -1.0
            };
            Marker(
                id,
                micro(lat),
                micro(lon),
                shown,
                s.ages.classify(age),
                order,
            )
        })
        .collect();
    Ok(view)
}

async fn card(State(s): State<S>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    const R: &str = "courier";
    if let Err(r) = bearer(&headers, s.ops_keys.as_ref(), R) {
        return r.into_response();
    }
    if !courier_wire::topic::valid_id(&id) {
        count(R, "bad_request");
        return refusal(
            StatusCode::BAD_REQUEST,
            "courier id must be 1-64 of [A-Za-z0-9._:-]",
        );
    }
    let mut conn = s.redis.clone();
    type Card = (
        Option<f64>,
        Vec<Option<(f64, f64)>>,
        Option<String>,
        Option<Vec<u8>>,
    );
    let read: Result<Card, _> = redis::pipe()
        .cmd("ZSCORE")
        .arg(&s.keys.seen)
        .arg(&id)
        .cmd("GEOPOS")
        .arg(&s.keys.live)
        .arg(&id)
        .cmd("HGET")
        .arg(&s.keys.order)
        .arg(&id)
        .cmd("HGET")
        .arg(&s.keys.seq)
        .arg(&id)
        .query_async(&mut conn)
        .await;
    let (seen, pos, order, seq) = match read {
        Ok(r) => r,
        Err(e) => return redis_failed(R, e),
    };
    let pos = pos.into_iter().next().flatten();
    if pos.is_none() && seen.is_none() {
        count(R, "not_found");
        return refusal(StatusCode::NOT_FOUND, "no live courier with this id");
    }
    let now = courier_wire::clock::unix_now();
    let seq = seq.as_deref().and_then(SeqState::decode);
    let age = seen.map(|t| (now - t).max(0.0));
    ok(
        R,
        json!({
            "id": id,
            "now": now,
            "last_seen": seen,
            "age": age,
            "freshness": age.map(|a| s.ages.classify(a)),
            "lat": pos.map(|p| p.1),
            "lon": pos.map(|p| p.0),
            "order": order,
            "seq": seq.map(|q| q.seq),
            "phone_ts": seq.map(|q| q.phone_ts),
            "phone_lag": seq.map(|q| (q.phone_lag() * 1000.0).round() / 1000.0),
            "seq_epoch_ts": seq.map(|q| q.epoch_ts),
        }),
    )
}

async fn totals_route(State(s): State<S>, headers: HeaderMap) -> Response {
    const R: &str = "totals";
    if let Err(r) = bearer(&headers, s.ops_keys.as_ref(), R) {
        return r.into_response();
    }
    let mut conn = s.redis.clone();
    let live: u64 = match redis::cmd("ZCARD")
        .arg(&s.keys.live)
        .query_async(&mut conn)
        .await
    {
        Ok(n) => n,
        Err(e) => return redis_failed(R, e),
    };
    let text = s.metrics.as_ref().map(|f| f());
    let now = courier_wire::clock::unix_now();
    let accepted = text.as_deref().and_then(totals::accepted);
    let rate = {
        let mut last = s.last_accepted.lock().unwrap_or_else(|p| p.into_inner());
        match (*last, accepted) {
            // Several maps poll: a reading less than a second old is reused, not re-rated.
            (Some((t, _, r)), _) if now - t < 1.0 => r,
            (prev, Some(a)) => {
                let r = prev.and_then(|(t, v, _)| totals::rate((t, v), (now, a)));
                *last = Some((now, a, r));
                r
            }
            (_, None) => None,
        }
    };
    ok(
        R,
        json!({
            "live": live,
            "accepted_total": accepted,
            "points_per_s": rate.map(|r| r.round()),
            "loss": text.as_deref().map(totals::Loss::from_metrics),
        }),
    )
}

async fn track_status(
    State(s): State<S>,
    headers: HeaderMap,
    Path(order): Path<String>,
) -> Response {
    const R: &str = "track_status";
    let claims = match bearer(&headers, s.viewer_keys.as_ref(), R) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    // A token for another order learns nothing about this one: the same 401.
    if claims.order.as_deref() != Some(order.as_str()) {
        count(R, "unauthorized");
        tracing::info!(route = R, "maps request refused: token for another order");
        return refusal(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
    }
    let mut conn = s.redis.clone();
    let courier: Result<Option<String>, _> = redis::cmd("HGET")
        .arg(&s.keys.order_courier)
        .arg(&order)
        .query_async(&mut conn)
        .await;
    match courier {
        Ok(c) => ok(
            R,
            json!({ "running": c.is_some(), "expires_at": claims.exp }),
        ),
        Err(e) => redis_failed(R, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csp_names_the_tile_server_and_the_gateway() {
        let c = csp(
            Some("https://{s}.tile.openstreetmap.org/{z}/{x}/{y}.png"),
            "ws://127.0.0.1:8083/mqtt",
        );
        assert!(c.contains("img-src 'self' data: https://*.tile.openstreetmap.org;"));
        assert!(c.contains("connect-src 'self' ws://127.0.0.1:8083;"));
        let none = csp(None, "wss://track.example.com/mqtt");
        assert!(none.contains("img-src 'self' data: ;"));
        assert!(none.contains("wss://track.example.com"));
    }
}
