//! The orders API, called by the order service (and the courier app's events) with the
//! service key:
//!
//! - `POST /orders/{order}/assign` `{"courier_id", "tenant"?, "pickup"?, "dropoff"?}`: the
//!   courier now carries the order, beside the others he carries (up to
//!   `fanout.max_orders_per_courier`); `tenant` (default `default`) names the order service
//!   whose webhook endpoints get the order's events; `pickup` / `dropoff` (`{"lat","lon"}`) are
//!   the places whose arrival ingest reports (`courier.arriving_pickup` / `_dropoff`).
//! - `POST /orders/{order}/tracking-token` `{"viewer":"customer"|"restaurant"}`: a short-lived
//!   token for this order only, with the topic and the WebSocket URL, and `tracking_url`
//!   (the customer page `/track/<order>?token=...`) when the process serves the maps.
//! - `POST /orders/{order}/events` + `Idempotency-Key`: `picked_up`, `delivered`. A replay of
//!   the key returns the first answer and does nothing again; the key with another body is
//!   refused (422). `delivered` ends the order everywhere.
//!
//! State lives in Redis (two Lua scripts), so every process answers alike. Each script also
//! writes the event it causes (`order.assigned`, `order.picked_up`, `order.delivered`) to the
//! bounded events stream in the same call (`emit.lua`), for the notify role to deliver.

use crate::events::{order_event, Stats};
use crate::hub::Hub;
use crate::source::end_here;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use courier_auth::{Claims, SigningKey};
use courier_wire::events::with_emit;
use courier_wire::topic::valid_id;
use courier_wire::{ApiError, Keys};
use redis::Script;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const STACK_LUA: &str = include_str!("stack.lua");
const ASSIGN_LUA: &str = include_str!("assign.lua");
const EVENT_LUA: &str = include_str!("event.lua");

/// What the handlers share.
pub(crate) struct OrdersApi {
    pub redis: courier_wire::RedisConn,
    pub keys: Keys,
    /// Mints tracking tokens (the viewer audience's private key).
    pub signer: SigningKey,
    pub service_key: String,
    pub token_ttl: Duration,
    pub ws_url: String,
    /// Base of `tracking_url` (the maps' public URL); `None`: not handed out.
    pub tracking_page_url: Option<String>,
    pub idempotency_ttl: Duration,
    pub hub: Arc<Hub>,
    pub stats: Arc<Stats>,
    /// Cap of the events stream (0: no events written).
    pub events_cap: u64,
    /// Orders one courier carries at once at most.
    pub max_orders: usize,
    assign: Script,
    event: Script,
}

impl OrdersApi {
    /// Hands out `tracking_url` with each token when `base` is set.
    pub(crate) fn with_tracking_page(mut self, base: Option<String>) -> Self {
        self.tracking_page_url = base.map(|b| b.trim_end_matches('/').to_string());
        self
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        redis: courier_wire::RedisConn,
        keys: Keys,
        signer: SigningKey,
        service_key: String,
        token_ttl: Duration,
        ws_url: String,
        idempotency_ttl: Duration,
        hub: Arc<Hub>,
        stats: Arc<Stats>,
        events_cap: u64,
        max_orders: usize,
    ) -> Self {
        OrdersApi {
            redis,
            keys,
            signer,
            service_key,
            token_ttl,
            ws_url,
            tracking_page_url: None,
            idempotency_ttl,
            hub,
            stats,
            events_cap,
            max_orders,
            assign: Script::new(&with_emit(&format!("{STACK_LUA}{ASSIGN_LUA}"))),
            event: Script::new(&with_emit(&format!("{STACK_LUA}{EVENT_LUA}"))),
        }
    }
}

/// The routes, to be served on `HTTP_LISTEN`.
pub(crate) fn router(api: Arc<OrdersApi>) -> Router {
    Router::new()
        .route("/orders/{order}/assign", post(assign))
        .route("/orders/{order}/tracking-token", post(tracking_token))
        .route("/orders/{order}/events", post(event))
        .layer(DefaultBodyLimit::max(8 * 1024))
        .with_state(api)
}

/// A refused call: the answer every API gives ([`ApiError`]) and the `result` label it is
/// counted under.
#[derive(Debug)]
pub(crate) struct Refused {
    answer: ApiError,
    result: &'static str,
}

fn fail(status: StatusCode, result: &'static str, message: impl Into<String>) -> Refused {
    Refused {
        answer: ApiError::new(status, message),
        result,
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        self.answer.into_response()
    }
}

fn redis_failed(e: redis::RedisError) -> Refused {
    tracing::warn!(error = %e, "orders API: redis call failed");
    fail(
        StatusCode::SERVICE_UNAVAILABLE,
        "error",
        "storage unavailable, retry later",
    )
}

fn check_service(api: &OrdersApi, headers: &HeaderMap) -> Result<(), Refused> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(courier_auth::bearer_credential);
    match presented {
        Some(k) if courier_auth::same_secret(k.as_bytes(), api.service_key.as_bytes()) => Ok(()),
        _ => Err(fail(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid service key is required (Authorization: Bearer)",
        )),
    }
}

fn check_order(order: &str) -> Result<(), Refused> {
    if valid_id(order) {
        Ok(())
    } else {
        Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "order ids are 1-64 of [A-Za-z0-9._:-]",
        ))
    }
}

fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Refused> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the body must be a JSON object",
        )),
    }
}

fn field<'a>(m: &'a serde_json::Map<String, Value>, name: &str) -> Result<&'a str, Refused> {
    m.get(name).and_then(Value::as_str).ok_or_else(|| {
        fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("missing string field {name:?}"),
        )
    })
}

/// An optional place field: `{"lat": .., "lon": ..}` within range (not 0,0).
fn place(m: &serde_json::Map<String, Value>, name: &str) -> Result<Option<(f64, f64)>, Refused> {
    let Some(v) = m.get(name) else {
        return Ok(None);
    };
    let lat = v.get("lat").and_then(Value::as_f64);
    let lon = v.get("lon").and_then(Value::as_f64);
    match (lat, lon) {
        (Some(lat), Some(lon))
            if (-90.0..=90.0).contains(&lat)
                && (-180.0..=180.0).contains(&lon)
                && (lat, lon) != (0.0, 0.0) =>
        {
            Ok(Some((lat, lon)))
        }
        _ => Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{name} must be {{\"lat\": -90..90, \"lon\": -180..180}}"),
        )),
    }
}

/// Runs a handler body and counts its outcome under `event`.
fn counted(event: &'static str, r: Result<Response, Refused>) -> Response {
    match r {
        Ok(resp) => {
            let result = if resp.headers().contains_key("idempotent-replayed") {
                "replay"
            } else {
                "ok"
            };
            order_event(event, result);
            resp
        }
        Err(e) => {
            order_event(event, e.result);
            e.into_response()
        }
    }
}

async fn assign(
    State(api): State<Arc<OrdersApi>>,
    Path(order): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    counted("assign", assign_inner(&api, &order, &headers, &body).await)
}

async fn assign_inner(
    api: &OrdersApi,
    order: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, Refused> {
    check_service(api, headers)?;
    check_order(order)?;
    let m = json_object(body)?;
    let courier = field(&m, "courier_id")?;
    if !valid_id(courier) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "courier ids are 1-64 of [A-Za-z0-9._:-]",
        ));
    }
    let tenant = match m.get("tenant") {
        None => "default",
        Some(Value::String(t)) if valid_id(t) => t.as_str(),
        Some(_) => {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "tenant ids are 1-64 of [A-Za-z0-9._:-]",
            ))
        }
    };
    let pickup = place(&m, "pickup")?;
    let dropoff = place(&m, "dropoff")?;
    let places = courier_wire::events::Places::new(pickup, dropoff).encode();
    let mut conn = api.redis.clone();
    let outcome: String = api
        .assign
        .key(&api.keys.order_courier)
        .key(&api.keys.order)
        .key(&api.keys.orders_ended)
        .key(&api.keys.order_tenant)
        .key(&api.keys.events)
        .key(&api.keys.events_dropped)
        .key(&api.keys.order_places)
        .arg(order)
        .arg(courier)
        .arg(tenant)
        .arg(api.events_cap)
        .arg(courier_wire::clock::unix_now())
        .arg(api.max_orders)
        .arg(places)
        .invoke_async(&mut conn)
        .await
        .map_err(redis_failed)?;
    if outcome == "ended" {
        return Err(fail(
            StatusCode::CONFLICT,
            "conflict",
            "the order has ended",
        ));
    }
    if outcome == "full" {
        return Err(fail(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "the courier carries {} orders already (fanout.max_orders_per_courier)",
                api.max_orders
            ),
        ));
    }
    Ok(Json(json!({ "order": order, "courier_id": courier })).into_response())
}

async fn tracking_token(
    State(api): State<Arc<OrdersApi>>,
    Path(order): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    counted(
        "tracking_token",
        token_inner(&api, &order, &headers, &body).await,
    )
}

async fn token_inner(
    api: &OrdersApi,
    order: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, Refused> {
    check_service(api, headers)?;
    check_order(order)?;
    let m = json_object(body)?;
    let viewer = field(&m, "viewer")?;
    if !matches!(viewer, "customer" | "restaurant") {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "viewer must be \"customer\" or \"restaurant\"",
        ));
    }
    let mut conn = api.redis.clone();
    let courier: Option<String> = redis::cmd("HGET")
        .arg(&api.keys.order_courier)
        .arg(order)
        .query_async(&mut conn)
        .await
        .map_err(redis_failed)?;
    if courier.is_none() {
        return Err(fail(
            StatusCode::NOT_FOUND,
            "not_found",
            "no running order with this id",
        ));
    }
    let now = courier_wire::clock::unix_now() as u64;
    let claims = Claims::viewer(viewer, order, now, api.token_ttl.as_secs());
    let token = api.signer.sign(&claims);
    let mut answer = json!({
        "token": token,
        "expires_at": claims.exp,
        "topic": courier_wire::track_topic(order),
        "ws_url": api.ws_url,
        "subprotocol": crate::SUBPROTOCOL,
        "viewer": viewer,
    });
    // Order ids and tokens are URL-safe as they are (valid_id; base64url JWT).
    if let Some(base) = &api.tracking_page_url {
        answer["tracking_url"] = json!(format!("{base}/track/{order}?token={token}"));
    }
    Ok(Json(answer).into_response())
}

async fn event(
    State(api): State<Arc<OrdersApi>>,
    Path(order): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let kind = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| match v.get("event").and_then(Value::as_str) {
            Some("picked_up") => Some("picked_up"),
            Some("delivered") => Some("delivered"),
            _ => None,
        })
        .unwrap_or("unknown");
    counted(kind, event_inner(&api, &order, &headers, &body).await)
}

/// `Idempotency-Key`: 1-200 visible ASCII characters.
/// The Redis key of one event's idempotency record. Both the order id and the client's key may
/// hold `:`, so the order id is written with its length first: order `a` with key `b:k` and order
/// `a:b` with key `k` would otherwise share one record (the second `delivered` would replay the
/// first answer and never end its order).
fn idempotency_record(prefix: &str, order: &str, key: &str) -> String {
    format!("{prefix}{}:{order}:{key}", order.len())
}

fn idempotency_key(headers: &HeaderMap) -> Result<&str, Refused> {
    let k = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the Idempotency-Key header is required",
            )
        })?;
    if k.is_empty() || k.len() > 200 || !k.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "Idempotency-Key must be 1-200 visible ASCII characters",
        ));
    }
    Ok(k)
}

async fn event_inner(
    api: &OrdersApi,
    order: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, Refused> {
    check_service(api, headers)?;
    check_order(order)?;
    let key = idempotency_key(headers)?;
    let m = json_object(body)?;
    let event = field(&m, "event")?;
    if !matches!(event, "picked_up" | "delivered") {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "event must be \"picked_up\" or \"delivered\"",
        ));
    }
    // serde_json's map is ordered by key: the same content gives the same fingerprint
    // whatever its spacing or field order.
    let fingerprint = serde_json::to_string(&m).expect("a JSON object serializes");
    let now = courier_wire::clock::unix_now();
    let answer = json!({ "order": order, "event": event, "at": now }).to_string();
    let mut conn = api.redis.clone();
    let (outcome, record): (String, String) = api
        .event
        .key(idempotency_record(&api.keys.order_event_idem, order, key))
        .key(&api.keys.order_courier)
        .key(&api.keys.order)
        .key(&api.keys.orders_ended)
        .key(&api.keys.order_tenant)
        .key(&api.keys.events)
        .key(&api.keys.events_dropped)
        .key(&api.keys.order_places)
        .arg(order)
        .arg(event)
        .arg(&fingerprint)
        .arg(now)
        .arg(api.idempotency_ttl.as_secs())
        .arg(api.token_ttl.as_secs().max(60))
        .arg(&api.keys.orders_ended_channel)
        .arg(&answer)
        .arg(api.events_cap)
        .invoke_async(&mut conn)
        .await
        .map_err(redis_failed)?;
    match outcome.as_str() {
        "done" => {
            if event == "delivered" {
                // This process at once; the others through the channel.
                end_here(&api.hub, &api.stats, order);
            }
            Ok(recorded(&answer, false))
        }
        "replay" => {
            let (first_fp, first_answer) = record.split_once('\n').unwrap_or(("", ""));
            if first_fp != fingerprint {
                return Err(fail(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "unprocessable",
                    "this Idempotency-Key was used with a different request",
                ));
            }
            Ok(recorded(first_answer, true))
        }
        "ended" => Err(fail(
            StatusCode::CONFLICT,
            "conflict",
            "the order has ended",
        )),
        _ => Err(fail(
            StatusCode::NOT_FOUND,
            "not_found",
            "no running order with this id",
        )),
    }
}

/// The recorded answer, as first given.
fn recorded(answer: &str, replayed: bool) -> Response {
    let mut r = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response();
    if replayed {
        r.headers_mut().insert(
            "idempotent-replayed",
            header::HeaderValue::from_static("true"),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_records_of_two_orders_never_collide() {
        let p = "order:event:";
        assert_ne!(
            idempotency_record(p, "a", "b:k"),
            idempotency_record(p, "a:b", "k")
        );
        assert_eq!(idempotency_record(p, "o-1", "evt"), "order:event:3:o-1:evt");
    }

    #[test]
    fn idempotency_keys_are_checked() {
        let mut h = HeaderMap::new();
        assert!(idempotency_key(&h).is_err());
        h.insert("idempotency-key", "a b".parse().unwrap());
        assert!(idempotency_key(&h).is_err());
        h.insert("idempotency-key", "evt-1:abc".parse().unwrap());
        assert_eq!(idempotency_key(&h).unwrap(), "evt-1:abc");
    }

    #[test]
    fn bodies_must_be_objects_with_string_fields() {
        assert!(json_object(b"[1]").is_err());
        assert!(json_object(b"nope").is_err());
        let m = json_object(br#"{"event":"delivered","n":1}"#).unwrap();
        assert_eq!(field(&m, "event").unwrap(), "delivered");
        assert!(field(&m, "n").is_err());
    }
}
