//! `GET /aggregates?from=&to=[&cell=]`: the anonymous aggregates for operations (demand and
//! speeds per area and hour).
//!
//! - A bearer JWT of the `trail` audience (operations and support staff hold those). The rows
//!   name no one, so no reason is asked and no audit row is written.
//! - `from` / `to` as in the trail API (RFC 3339 UTC or unix seconds; `to` exclusive) over the
//!   hour's start, at most [`MAX_WINDOW`]; `cell`: a geohash prefix (1-6 characters) to keep
//!   one area. More than [`MAX_ROWS`] rows: 413.
//! - The answer: `{"from", "to", "cells": [{"hour", "cell", "couriers", "points", "segments",
//!   "median_speed_mps", "p90_speed_mps"}]}`, by hour then cell.

use crate::trail::{bearer, parse_time, refused_token, result_label, rfc3339};
use crate::Clock;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use courier_auth::Verifier;
use courier_wire::metrics as m;
use courier_wire::ApiError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Longest window one request reads.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(31 * 86_400);
/// Most rows of one answer.
pub(crate) const MAX_ROWS: usize = 100_000;

const READ_SQL: &str =
    "SELECT hour, cell, couriers, points, segments, median_speed_mps, p90_speed_mps \
     FROM courier_aggregates WHERE hour >= $1 AND hour < $2 AND starts_with(cell, $3) \
     ORDER BY hour, cell LIMIT $4";

/// The aggregate API; cheap to clone.
#[derive(Clone)]
pub struct AggregateApi {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    keys: Verifier,
    clock: Clock,
}

impl AggregateApi {
    pub fn new(database_url: &str, keys: Verifier, clock: Clock) -> Self {
        AggregateApi {
            inner: Arc::new(Inner {
                url: database_url.to_string(),
                keys,
                clock,
            }),
        }
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/aggregates", get(get_aggregates))
            .with_state(self)
    }
}

async fn get_aggregates(
    State(api): State<AggregateApi>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let result = answer(&api, query, &headers).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(r) => result_label(r),
    };
    metrics::counter!(m::AGGREGATE_REQUESTS, "result" => label).increment(1);
    match result {
        Ok(r) => r,
        Err(r) => r.into_response(),
    }
}

async fn answer(
    api: &AggregateApi,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    bearer(headers, &api.inner.keys, (api.inner.clock)())
        .map_err(|r| refused_token("aggregates", r))?;
    let Query(q) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let from = parse_time("from", q.get("from"))?;
    let to = parse_time("to", q.get("to"))?;
    let window = to
        .duration_since(from)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "`to` must be after `from`"))?;
    if window > MAX_WINDOW {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the window is longer than the maximum of 31 days",
        ));
    }
    let cell = q.get("cell").map(|s| s.trim()).unwrap_or("");
    if cell.len() > crate::geohash::PRECISION
        || !cell
            .bytes()
            .all(|b| b"0123456789bcdefghjkmnpqrstuvwxyz".contains(&b))
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "`cell` must be a geohash prefix of at most 6 characters",
        ));
    }
    let rows = read(api, from, to, cell).await.map_err(|e| {
        tracing::error!(error = %e, "aggregate read failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the history database is unavailable",
        )
    })?;
    if rows.len() > MAX_ROWS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("more than {MAX_ROWS} rows: ask for a shorter window or a cell"),
        ));
    }
    let cells: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "hour": rfc3339(r.get::<_, SystemTime>(0)),
                "cell": r.get::<_, String>(1),
                "couriers": r.get::<_, i32>(2),
                "points": r.get::<_, i32>(3),
                "segments": r.get::<_, i32>(4),
                "median_speed_mps": r.get::<_, Option<f64>>(5),
                "p90_speed_mps": r.get::<_, Option<f64>>(6),
            })
        })
        .collect();
    Ok(Json(serde_json::json!({
        "from": rfc3339(from),
        "to": rfc3339(to),
        "cells": cells,
    }))
    .into_response())
}

async fn read(
    api: &AggregateApi,
    from: SystemTime,
    to: SystemTime,
    cell: &str,
) -> Result<Vec<tokio_postgres::Row>, crate::HistoryError> {
    // A connection per request: operations read aggregates a few times a minute at most.
    let client = crate::sink::connect(&api.inner.url, "courier-aggregate-api").await?;
    let limit = (MAX_ROWS + 1) as i64;
    Ok(client.query(READ_SQL, &[&from, &to, &cell, &limit]).await?)
}
