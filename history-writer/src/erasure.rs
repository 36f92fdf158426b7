//! `POST /couriers/{id}/erasure` with `{"reason": "..."}`: removes every stored trace of one
//! courier's locations on request (his right to erasure), in one audited operation.
//!
//! - A bearer JWT of the `privacy` audience (the data-protection officer; its own key, so no
//!   support `trail` token can erase). Missing, bad, expired or of another audience: one
//!   generic 401, and nothing is touched.
//! - In one PostgreSQL transaction: `DELETE` of his rows in every partition of
//!   `courier_points`, then one Redis script (atomic) that removes him from `couriers:live`,
//!   `couriers:seen`, `couriers:seq` and his order bindings (`courier:order`, and every
//!   `order:courier` field naming him), then the `erasure_log` row (who, whom, why, the counts),
//!   then COMMIT. His id is also cleared from the order events of the outbox. Redis refusing rolls the deletion back (503, retry); the Redis script is
//!   idempotent, so a retry after a failed commit removes the rest.
//! - The answer reports what was removed, per store. The anonymous aggregates stay: they name
//!   no one.
//!
//! What it cannot reach: points still on their way (the bus, a writer's buffer: about a
//! second) and his audit rows (`trail_access_log`, kept `audit_retention_days` for
//! accountability). Stop his device token first (docs/privacy.md).

use crate::error::HistoryError;
use crate::trail::{bearer, check_reason, refused_token, result_label};
use crate::Clock;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use courier_auth::Verifier;
use courier_wire::metrics as m;
use courier_wire::ApiError;
use courier_wire::{Keys, RedisConn, RedisOptions, RedisTarget};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// What one erasure removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    /// Rows of `courier_points`, all partitions.
    pub postgres_points: u64,
    /// Members of `couriers:live` and `couriers:seen`.
    pub redis_live: i64,
    /// Fields of `couriers:seq`.
    pub redis_seq: i64,
    /// Fields of `courier:order` and `order:courier`.
    pub order_bindings: i64,
    /// Order events (the outbox, docs/events.md) whose courier id was cleared: an arrival
    /// event says where he was and when.
    pub order_events: u64,
}

/// The erasure API; cheap to clone.
#[derive(Clone)]
pub struct Erasure {
    inner: Arc<Inner>,
}

struct Inner {
    database_url: String,
    redis: RedisTarget,
    keys: Keys,
    verifier: Verifier,
    clock: Clock,
}

/// Removes one courier from the live index, the seq state and every order binding; returns
/// [live + seen members, seq fields, binding fields]. KEYS: live, seen, seq, order (his
/// orders, all of them: one field), order_courier. ARGV: the courier id.
const REDIS_SCRIPT: &str = r"
local c = ARGV[1]
local live = redis.call('ZREM', KEYS[1], c) + redis.call('ZREM', KEYS[2], c)
local seq = redis.call('HDEL', KEYS[3], c)
local bindings = redis.call('HDEL', KEYS[4], c)
local pairs_ = redis.call('HGETALL', KEYS[5])
for i = 1, #pairs_, 2 do
  if pairs_[i + 1] == c then
    bindings = bindings + redis.call('HDEL', KEYS[5], pairs_[i])
  end
end
return {live, seq, bindings}
";

const AUDIT_SQL: &str = "INSERT INTO erasure_log \
     (actor, courier_id, reason, points, redis_live, redis_seq, order_bindings) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id";

#[derive(Deserialize)]
struct Body {
    reason: String,
}

impl Erasure {
    pub fn new(
        database_url: &str,
        redis: &RedisTarget,
        keys: Keys,
        verifier: Verifier,
        clock: Clock,
    ) -> Result<Self, HistoryError> {
        Ok(Erasure {
            inner: Arc::new(Inner {
                database_url: database_url.to_string(),
                redis: redis.clone(),
                keys,
                verifier,
                clock,
            }),
        })
    }

    /// The route, to merge into the server on `HTTP_LISTEN`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/couriers/{id}/erasure", post(post_erasure))
            .with_state(self)
    }

    /// Erases `courier`, recording `actor` and `reason`; returns the counts and the audit id.
    pub async fn erase(
        &self,
        actor: &str,
        courier: &str,
        reason: &str,
    ) -> Result<(Removed, i64), HistoryError> {
        let mut pg = crate::sink::connect(&self.inner.database_url, "courier-erasure").await?;
        let tx = pg.transaction().await?;
        tx.batch_execute("SET LOCAL lock_timeout = '10s'; SET LOCAL statement_timeout = '10min'")
            .await?;
        let mut removed = Removed {
            postgres_points: tx
                .execute(
                    "DELETE FROM courier_points WHERE courier_id = $1",
                    &[&courier],
                )
                .await?,
            order_events: tx
                .execute(
                    "UPDATE order_events SET courier_id = NULL WHERE courier_id = $1",
                    &[&courier],
                )
                .await?,
            ..Removed::default()
        };
        let options = RedisOptions {
            response_timeout: Duration::from_secs(5),
            ..RedisOptions::default()
        };
        let mut conn = RedisConn::connect(&self.inner.redis, &options).await?;
        let k = &self.inner.keys;
        let (live, seq, bindings): (i64, i64, i64) = redis::Script::new(REDIS_SCRIPT)
            .key(&k.live)
            .key(&k.seen)
            .key(&k.seq)
            .key(&k.order)
            .key(&k.order_courier)
            .arg(courier)
            .invoke_async(&mut conn)
            .await?;
        removed.redis_live = live;
        removed.redis_seq = seq;
        removed.order_bindings = bindings;
        let points = i64::try_from(removed.postgres_points).unwrap_or(i64::MAX);
        let id: i64 = tx
            .query_one(
                AUDIT_SQL,
                &[
                    &actor,
                    &courier,
                    &reason,
                    &points,
                    &(live as i32),
                    &(seq as i32),
                    &(bindings as i32),
                ],
            )
            .await?
            .get(0);
        tx.commit().await?;
        Ok((removed, id))
    }
}

async fn post_erasure(
    State(e): State<Erasure>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<Body>, JsonRejection>,
) -> Response {
    let result = answer(&e, path, &headers, body).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(r) => result_label(r),
    };
    metrics::counter!(m::ERASURE_REQUESTS, "result" => label).increment(1);
    match result {
        Ok(r) => r,
        Err(r) => r.into_response(),
    }
}

async fn answer(
    e: &Erasure,
    path: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Result<Json<Body>, JsonRejection>,
) -> Result<Response, ApiError> {
    let now = (e.inner.clock)();
    let claims =
        bearer(headers, &e.inner.verifier, now).map_err(|r| refused_token("erasure", r))?;
    let Path(courier) = path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    if !courier_wire::topic::valid_id(&courier) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "courier id must be 1-64 of [A-Za-z0-9._:-]",
        ));
    }
    let Json(body) = body.map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the body must be JSON {\"reason\": \"...\"}",
        )
    })?;
    let reason = check_reason(&body.reason)?;
    let started = std::time::Instant::now();
    let (removed, audit_id) = e
        .erase(&claims.sub, &courier, reason)
        .await
        .map_err(|err| {
            tracing::error!(error = %err, "erasure failed; nothing was removed from PostgreSQL");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "erasure failed and was rolled back; try again",
            )
        })?;
    metrics::counter!(m::ERASURE_POINTS).increment(removed.postgres_points);
    tracing::info!(actor = %claims.sub, courier = %courier, points = removed.postgres_points,
        seconds = started.elapsed().as_secs_f64(), "courier erased (audited)");
    Ok(Json(serde_json::json!({
        "courier_id": courier,
        "removed": removed,
        "audit_id": audit_id,
    }))
    .into_response())
}
