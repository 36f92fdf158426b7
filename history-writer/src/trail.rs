//! `GET /couriers/{id}/trail?from=&to=&reason=`: a courier's past trail for support staff.
//!
//! - A bearer JWT of the `trail` audience (`courier_auth`): missing, bad, or of another
//!   audience (signed with another audience's key): one generic 401.
//! - `from` and `to` are RFC 3339 UTC times (`2026-11-30T08:00:00Z`) or unix seconds, over the
//!   server's receive time (`received_at`: the clock we trust, and the one the partitions and
//!   the `(courier_id, received_at)` index are built on); `to` is exclusive. `reason` is
//!   required. A bad time, a missing reason or a window longer than `trail_max_window`: 400. A
//!   window with more than `trail_max_points` points: 413 (nothing returned, no audit row).
//! - The read and its `trail_access_log` row are one transaction: no audit row, no data.
//! - The answer is a GeoJSON Feature: a LineString (a Point for a single fix, no geometry for
//!   none) in phone-time order, with `properties.points[i]` describing coordinate `i`
//!   (seq, phone time, receive time, order). A point delivered twice appears once: rows are
//!   unique on (seq, phone time), so a duplicate delivery collapses while a different point
//!   under a reused seq (an app reinstall restarts seq) is kept.
//!
//! Errors are JSON `{"error": "..."}`.

use crate::config::HistoryConfig;
use crate::error::HistoryError;
use crate::Clock;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use courier_auth::Verifier;
use courier_wire::metrics as m;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::Semaphore;
use tokio_postgres::Client;

/// Longest accepted reason, characters.
pub const MAX_REASON_CHARS: usize = 1000;

/// The trail API; cheap to clone.
#[derive(Clone)]
pub struct Trail {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    /// The trail audience's public keys.
    keys: Verifier,
    max_window: Duration,
    max_points: usize,
    clock: Clock,
    idle: Mutex<Vec<Client>>,
    permits: Semaphore,
}

/// A refusal: status and message.
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            message: message.into(),
        }
    }

    fn result(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            _ => "error",
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The one answer every failed token gets: telling a caller why (expired, forged, unknown key)
/// would help him forge the next one. The reason goes to the log and to
/// `trail_token_refusals_total{reason}`.
fn unauthorized(reason: &'static str) -> Refusal {
    metrics::counter!(courier_wire::metrics::TRAIL_TOKEN_REFUSALS, "reason" => reason).increment(1);
    tracing::info!(reason, "trail request refused: token");
    Refusal::new(StatusCode::UNAUTHORIZED, "a valid bearer token is required")
}

/// One point as read.
struct Fix {
    seq: i64,
    phone_ts: SystemTime,
    received_at: SystemTime,
    order_id: Option<String>,
    lat: f64,
    lon: f64,
}

#[derive(Serialize)]
struct PointProps {
    seq: i64,
    phone_ts: String,
    received_at: String,
    order_id: Option<String>,
}

const READ_SQL: &str = "SELECT seq, phone_ts, received_at, order_id, lat, lon FROM ( \
       SELECT DISTINCT ON (seq, phone_ts) seq, phone_ts, received_at, order_id, lat, lon \
       FROM courier_points WHERE courier_id = $1 AND received_at >= $2 AND received_at < $3 \
       ORDER BY seq, phone_ts, received_at) t \
     ORDER BY phone_ts, seq LIMIT $4";

const AUDIT_SQL: &str =
    "INSERT INTO trail_access_log (actor, courier_id, window_from, window_to, reason, row_count) \
     VALUES ($1, $2, $3, $4, $5, $6)";

impl Trail {
    pub fn new(database_url: &str, keys: Verifier, config: &HistoryConfig, clock: Clock) -> Self {
        Trail {
            inner: Arc::new(Inner {
                url: database_url.to_string(),
                keys,
                max_window: config.trail_max_window,
                max_points: config.trail_max_points,
                clock,
                idle: Mutex::new(Vec::new()),
                permits: Semaphore::new(config.trail_connections),
            }),
        }
    }

    /// The routes, to merge into the server on `HTTP_LISTEN`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/couriers/{id}/trail", get(get_trail))
            .with_state(self)
    }

    /// Reads the trail and writes its audit row in one transaction.
    async fn read(
        &self,
        actor: &str,
        courier: &str,
        from: SystemTime,
        to: SystemTime,
        reason: &str,
    ) -> Result<Option<Vec<Fix>>, HistoryError> {
        let _permit = self
            .inner
            .permits
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let pooled = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let mut client = match pooled {
            Some(c) if !c.is_closed() => c,
            _ => crate::sink::connect(&self.inner.url, "courier-trail-api").await?,
        };
        let result = async {
            let tx = client.transaction().await?;
            tx.batch_execute("SET LOCAL statement_timeout = '30s'")
                .await?;
            // One row past the cap tells a window that is too large, without reading it all.
            let limit = i64::try_from(self.inner.max_points + 1).unwrap_or(i64::MAX);
            let rows = tx.query(READ_SQL, &[&courier, &from, &to, &limit]).await?;
            if rows.len() > self.inner.max_points {
                return Ok(None);
            }
            let fixes: Vec<Fix> = rows
                .iter()
                .map(|r| Fix {
                    seq: r.get(0),
                    phone_ts: r.get(1),
                    received_at: r.get(2),
                    order_id: r.get(3),
                    lat: r.get(4),
                    lon: r.get(5),
                })
                .collect();
            let count = i32::try_from(fixes.len()).unwrap_or(i32::MAX);
            tx.execute(AUDIT_SQL, &[&actor, &courier, &from, &to, &reason, &count])
                .await?;
            tx.commit().await?;
            Ok::<_, HistoryError>(Some(fixes))
        }
        .await;
        if result.is_ok() {
            self.inner
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(client);
        }
        result
    }
}

/// `from` / `to`: RFC 3339 in UTC, or unix seconds.
fn parse_time(name: &str, v: Option<&String>) -> Result<SystemTime, Refusal> {
    let v = v.map(|s| s.trim()).filter(|s| !s.is_empty()).ok_or_else(|| {
        Refusal::new(StatusCode::BAD_REQUEST, format!("`{name}` is required (RFC 3339 UTC, e.g. 2026-11-30T08:00:00Z, or unix seconds)"))
    })?;
    if let Ok(secs) = v.parse::<f64>() {
        if secs.is_finite() && (0.0..1e11).contains(&secs) {
            return Ok(crate::rows::system_time(secs));
        }
    } else if let Ok(t) = humantime::parse_rfc3339_weak(v) {
        return Ok(t);
    }
    Err(Refusal::new(
        StatusCode::BAD_REQUEST,
        format!(
            "`{name}` is not a time: use RFC 3339 in UTC (2026-11-30T08:00:00Z) or unix seconds"
        ),
    ))
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

async fn get_trail(
    State(trail): State<Trail>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let result = answer(&trail, path, query, &headers).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(r) => r.result(),
    };
    metrics::counter!(m::TRAIL_REQUESTS, "result" => label).increment(1);
    match result {
        Ok(r) => r,
        Err(r) => r.into_response(),
    }
}

async fn answer(
    trail: &Trail,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, Refusal> {
    // Who asks comes first: an anonymous caller learns nothing about the parameters.
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| unauthorized("missing"))?;
    let now = (trail.inner.clock)();
    let claims = trail
        .inner
        .keys
        .verify(token, now.max(0.0) as u64)
        .map_err(|e| unauthorized(e.label()))?;

    let Path(courier) = path.map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    if !courier_wire::topic::valid_id(&courier) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "courier id must be 1-64 of [A-Za-z0-9._:-]",
        ));
    }
    let Query(q) = query.map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let reason = q.get("reason").map(|s| s.trim()).unwrap_or("");
    if reason.is_empty() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "`reason` is required: why this trail is read",
        ));
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("`reason` is longer than {MAX_REASON_CHARS} characters"),
        ));
    }
    let from = parse_time("from", q.get("from"))?;
    let to = parse_time("to", q.get("to"))?;
    let window = to
        .duration_since(from)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Refusal::new(StatusCode::BAD_REQUEST, "`to` must be after `from`"))?;
    if window > trail.inner.max_window {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the window is longer than the maximum of {}",
                humantime::format_duration(trail.inner.max_window)
            ),
        ));
    }

    let fixes = trail
        .read(&claims.sub, &courier, from, to, reason)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "trail read failed");
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the history database is unavailable; nothing was read",
            )
        })?;
    let Some(fixes) = fixes else {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the window holds more than {} points: ask for a shorter one",
                trail.inner.max_points
            ),
        ));
    };
    tracing::info!(actor = %claims.sub, courier = %courier, points = fixes.len(), "trail read (audited)");
    Ok(Json(feature(&courier, from, to, &fixes)).into_response())
}

/// The GeoJSON Feature of a trail.
fn feature(courier: &str, from: SystemTime, to: SystemTime, fixes: &[Fix]) -> serde_json::Value {
    let coords: Vec<[f64; 2]> = fixes.iter().map(|f| [f.lon, f.lat]).collect();
    let geometry = match coords.len() {
        0 => serde_json::Value::Null,
        1 => serde_json::json!({ "type": "Point", "coordinates": coords[0] }),
        _ => serde_json::json!({ "type": "LineString", "coordinates": coords }),
    };
    let points: Vec<PointProps> = fixes
        .iter()
        .map(|f| PointProps {
            seq: f.seq,
            phone_ts: rfc3339(f.phone_ts),
            received_at: rfc3339(f.received_at),
            order_id: f.order_id.clone(),
        })
        .collect();
    serde_json::json!({
        "type": "Feature",
        "geometry": geometry,
        "properties": {
            "courier_id": courier,
            "from": rfc3339(from),
            "to": rfc3339(to),
            "count": fixes.len(),
            "points": points,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn times_parse_in_both_forms() {
        let s = |v: &str| parse_time("from", Some(&v.to_string()));
        let a = s("2026-11-30T08:00:00Z").ok().unwrap();
        let b = s("1796025600").ok().unwrap();
        assert_eq!(a, b);
        assert!(s("2026-11-30T08:00:00.5Z").is_ok());
        for bad in ["yesterday", "2026-13-01T00:00:00Z", "-5", "NaN", "1e30"] {
            assert_eq!(
                s(bad).err().unwrap().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert!(parse_time("to", None).is_err());
    }

    #[test]
    fn geometry_follows_the_number_of_points() {
        let fix = |seq| Fix {
            seq,
            phone_ts: UNIX_EPOCH,
            received_at: UNIX_EPOCH,
            order_id: None,
            lat: 24.0,
            lon: 46.0 + seq as f64,
        };
        let t = UNIX_EPOCH;
        assert!(feature("c1", t, t, &[])["geometry"].is_null());
        assert_eq!(feature("c1", t, t, &[fix(1)])["geometry"]["type"], "Point");
        let f = feature("c1", t, t, &[fix(1), fix(2)]);
        assert_eq!(f["geometry"]["type"], "LineString");
        assert_eq!(
            f["geometry"]["coordinates"][1],
            serde_json::json!([48.0, 24.0])
        );
        assert_eq!(f["properties"]["points"][1]["seq"], 2);
        assert_eq!(f["properties"]["count"], 2);
    }
}
