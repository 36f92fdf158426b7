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
//! `GET /couriers/{id}/own-trail?from=&to=` is the same read for the courier himself (his
//! right of access): a device token of the `courier` audience whose `sub` is `{id}`, any other
//! courier's id is 403; no reason needed; audited the same, under actor `courier:<id>`.
//!
//! Operations staff's tokens (audience `ops`, the live map's) are admitted on `trail` too when
//! [`Trail::with_ops_keys`] gave their keys: the same reason and window rules, audited under
//! actor `ops:<user>` so the log tells a map user from a support tool.
//!
//! Errors are JSON `{"error": "..."}`.

use crate::config::HistoryConfig;
use crate::error::HistoryError;
use crate::Clock;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use courier_auth::Verifier;
use courier_wire::metrics as m;
use courier_wire::ApiError;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Longest accepted reason, characters.
pub(crate) const MAX_REASON_CHARS: usize = 1000;

/// The trail API; cheap to clone.
#[derive(Clone)]
pub struct Trail {
    inner: Arc<Inner>,
}

struct Inner {
    /// At most `history.trail_connections` connections, shared by every request.
    pool: deadpool_postgres::Pool,
    /// The trail audience's public keys.
    keys: Verifier,
    /// The courier audience's public keys, for `own-trail`; `None`: that route is not served.
    own_keys: Option<Verifier>,
    /// The ops audience's public keys, also admitted on `trail`; `None`: trail tokens only.
    ops_keys: Option<Verifier>,
    max_window: Duration,
    max_points: usize,
    clock: Clock,
}

/// The `result` label a refusal is counted under.
pub(crate) fn result_label(r: &ApiError) -> &'static str {
    match r.status {
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        _ => "error",
    }
}

/// The one answer every failed token gets: telling a caller why (expired, forged, unknown key)
/// would help him forge the next one. The reason goes to the log and to
/// `trail_token_refusals_total{reason}`.
fn unauthorized(reason: &'static str) -> ApiError {
    metrics::counter!(courier_wire::metrics::TRAIL_TOKEN_REFUSALS, "reason" => reason).increment(1);
    tracing::info!(reason, "trail request refused: token");
    ApiError::new(StatusCode::UNAUTHORIZED, "a valid bearer token is required")
}

/// The claims of the request's bearer token under `keys`, or the reason it is refused
/// (missing, malformed, wrong_audience, expired, ...). The caller answers one generic 401.
pub(crate) fn bearer(
    headers: &HeaderMap,
    keys: &Verifier,
    now: f64,
) -> Result<courier_auth::Claims, &'static str> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(courier_auth::bearer_credential)
        .ok_or("missing")?;
    keys.verify(token, now.max(0.0) as u64)
        .map_err(|e| e.label())
}

/// The generic 401 of the privacy doors (erasure, aggregates): the reason goes to the log only.
pub(crate) fn refused_token(door: &'static str, reason: &'static str) -> ApiError {
    tracing::info!(door, reason, "request refused: token");
    ApiError::new(StatusCode::UNAUTHORIZED, "a valid bearer token is required")
}

/// `reason` of a request: required, at most [`MAX_REASON_CHARS`].
pub(crate) fn check_reason(reason: &str) -> Result<&str, ApiError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "`reason` is required: why this is done",
        ));
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`reason` is longer than {MAX_REASON_CHARS} characters"),
        ));
    }
    Ok(reason)
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
    /// Does not connect yet: the pool connects on the first request (fails only on a
    /// `database_url` that is not a PostgreSQL URL).
    pub fn new(
        database_url: &str,
        keys: Verifier,
        config: &HistoryConfig,
        clock: Clock,
    ) -> Result<Self, HistoryError> {
        Ok(Trail {
            inner: Arc::new(Inner {
                pool: crate::pool::pool(
                    database_url,
                    "courier-trail-api",
                    config.trail_connections,
                )?,
                keys,
                own_keys: None,
                ops_keys: None,
                max_window: config.trail_max_window,
                max_points: config.trail_max_points,
                clock,
            }),
        })
    }

    /// Also serves `own-trail` to couriers, checking their device tokens with `keys`.
    pub fn with_courier_keys(self, keys: Verifier) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|_| {
            unreachable!("with_courier_keys is called on a fresh Trail, before any clone")
        });
        Trail {
            inner: Arc::new(Inner {
                own_keys: Some(keys),
                ..inner
            }),
        }
    }

    /// Also admits operations staff's map tokens on `trail`, checking them with `keys`.
    pub fn with_ops_keys(self, keys: Verifier) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|_| {
            unreachable!("with_ops_keys is called on a fresh Trail, before any clone")
        });
        Trail {
            inner: Arc::new(Inner {
                ops_keys: Some(keys),
                ..inner
            }),
        }
    }

    /// The routes, to merge into the server on `HTTP_LISTEN`.
    pub fn router(self) -> Router {
        let own = self.inner.own_keys.is_some();
        let r = Router::new().route("/couriers/{id}/trail", get(get_trail));
        let r = if own {
            r.route("/couriers/{id}/own-trail", get(get_own_trail))
        } else {
            r
        };
        r.with_state(self)
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
        let mut client = crate::pool::get(&self.inner.pool).await?;
        async {
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
        .await
    }
}

/// `from` / `to`: RFC 3339 in UTC, or unix seconds.
pub(crate) fn parse_time(name: &str, v: Option<&String>) -> Result<SystemTime, ApiError> {
    let v = v.map(|s| s.trim()).filter(|s| !s.is_empty()).ok_or_else(|| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("`{name}` is required (RFC 3339 UTC, e.g. 2026-11-30T08:00:00Z, or unix seconds)"))
    })?;
    if let Ok(secs) = v.parse::<f64>() {
        if secs.is_finite() && (0.0..1e11).contains(&secs) {
            return Ok(crate::rows::system_time(secs));
        }
    } else if let Ok(t) = humantime::parse_rfc3339_weak(v) {
        return Ok(t);
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        format!(
            "`{name}` is not a time: use RFC 3339 in UTC (2026-11-30T08:00:00Z) or unix seconds"
        ),
    ))
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

async fn get_trail(
    State(trail): State<Trail>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let result = answer(&trail, false, path, query, &headers).await;
    respond(m::TRAIL_REQUESTS, result)
}

async fn get_own_trail(
    State(trail): State<Trail>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let result = answer(&trail, true, path, query, &headers).await;
    respond(m::ACCESS_REQUESTS, result)
}

fn respond(metric: &'static str, result: Result<Response, ApiError>) -> Response {
    let label = match &result {
        Ok(_) => "ok",
        Err(r) => result_label(r),
    };
    metrics::counter!(metric, "result" => label).increment(1);
    match result {
        Ok(r) => r,
        Err(r) => r.into_response(),
    }
}

/// Why a courier's own read is audited, when he gives no reason.
const OWN_REASON: &str = "access by the courier himself";

async fn answer(
    trail: &Trail,
    own: bool,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    // Who asks comes first: an anonymous caller learns nothing about the parameters.
    let now = (trail.inner.clock)();
    let keys = match (own, &trail.inner.own_keys) {
        (true, Some(k)) => k,
        (true, None) => return Err(ApiError::new(StatusCode::NOT_FOUND, "not served here")),
        (false, _) => &trail.inner.keys,
    };
    // An ops token is signed with another key (its kid is unknown to the trail keys): tried
    // second, and a refusal reports the trail keys' reason.
    let (claims, via_ops) = match bearer(headers, keys, now) {
        Ok(c) => (c, false),
        Err(why) => match (own, &trail.inner.ops_keys) {
            (false, Some(ops)) => (
                bearer(headers, ops, now).map_err(|_| unauthorized(why))?,
                true,
            ),
            _ => return Err(unauthorized(why)),
        },
    };

    let Path(courier) = path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    if !courier_wire::topic::valid_id(&courier) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "courier id must be 1-64 of [A-Za-z0-9._:-]",
        ));
    }
    // A device token opens its own courier's trail and no other: asked for another, the
    // answer says nothing about him (not even whether he has points).
    if own && claims.sub != courier {
        tracing::info!(courier = %claims.sub, "own-trail refused: another courier's id");
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "a device token reads only its own courier's trail",
        ));
    }
    let Query(q) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let given = q.get("reason").map(|s| s.trim()).unwrap_or("");
    let reason = if own && given.is_empty() {
        OWN_REASON
    } else {
        check_reason(given)?
    };
    let actor = if own {
        format!("courier:{}", claims.sub)
    } else if via_ops {
        format!("ops:{}", claims.sub)
    } else {
        claims.sub.clone()
    };
    let from = parse_time("from", q.get("from"))?;
    let to = parse_time("to", q.get("to"))?;
    let window = to
        .duration_since(from)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "`to` must be after `from`"))?;
    if window > trail.inner.max_window {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the window is longer than the maximum of {}",
                humantime::format_duration(trail.inner.max_window)
            ),
        ));
    }

    let fixes = trail
        .read(&actor, &courier, from, to, reason)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "trail read failed");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the history database is unavailable; nothing was read",
            )
        })?;
    let Some(fixes) = fixes else {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the window holds more than {} points: ask for a shorter one",
                trail.inner.max_points
            ),
        ));
    };
    tracing::info!(actor = %actor, courier = %courier, points = fixes.len(), "trail read (audited)");
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
