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
use serde::{Deserialize, Serialize};
use serde_json::Value;
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

/// The body as a JSON object. Read by hand, not with axum's `Json` extractor, which would
/// refuse a body without `Content-Type: application/json` (415) that clients have always sent.
fn json_object(body: &[u8]) -> Result<Value, Refused> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the body must be a JSON object",
        )),
    }
}

/// The body as the request `T`. Through the parsed object: a key given twice counts once
/// (the last), as it always has; serde's derive would refuse it.
fn request<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(Value, T), Refused> {
    let object = json_object(body)?;
    let req = T::deserialize(&object).map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the body must be a JSON object",
        )
    })?;
    Ok((object, req))
}

/// A request field as sent: absent, of its type, or anything else (`null` included), so that
/// each refusal names its field as the API always has. Unknown fields are ignored (and still
/// part of an event's fingerprint).
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum Sent<T> {
    #[default]
    #[serde(skip_deserializing)]
    Absent,
    Given(T),
    Other(serde::de::IgnoredAny),
}

impl Sent<String> {
    /// The string, or a refusal naming the field.
    fn required(&self, name: &str) -> Result<&str, Refused> {
        match self {
            Sent::Given(v) => Ok(v),
            _ => Err(fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("missing string field {name:?}"),
            )),
        }
    }
}

/// `{"lat": .., "lon": ..}`, other keys ignored.
#[derive(Debug, Clone, Copy)]
struct Place {
    lat: f64,
    lon: f64,
}

impl<'de> Deserialize<'de> for Place {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct LatLon {
            lat: f64,
            lon: f64,
        }
        // An object only: a derived struct would also take `[lat, lon]`.
        let m = serde_json::Map::<String, Value>::deserialize(d)?;
        let p = LatLon::deserialize(Value::Object(m)).map_err(serde::de::Error::custom)?;
        Ok(Place {
            lat: p.lat,
            lon: p.lon,
        })
    }
}

/// An optional place field within range (not 0,0).
fn place(sent: &Sent<Place>, name: &str) -> Result<Option<(f64, f64)>, Refused> {
    match sent {
        Sent::Absent => Ok(None),
        Sent::Given(Place { lat, lon })
            if (-90.0..=90.0).contains(lat)
                && (-180.0..=180.0).contains(lon)
                && (*lat, *lon) != (0.0, 0.0) =>
        {
            Ok(Some((*lat, *lon)))
        }
        _ => Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{name} must be {{\"lat\": -90..90, \"lon\": -180..180}}"),
        )),
    }
}

/// `POST /orders/{order}/assign`.
#[derive(Debug, Deserialize)]
struct AssignRequest {
    #[serde(default)]
    courier_id: Sent<String>,
    #[serde(default)]
    tenant: Sent<String>,
    #[serde(default)]
    pickup: Sent<Place>,
    #[serde(default)]
    dropoff: Sent<Place>,
}

/// Its answer. Fields in alphabetical order: the order `json!` wrote them in (serde_json's map
/// is sorted), so the bytes stay what clients have seen.
#[derive(Debug, Serialize)]
struct Assigned<'a> {
    courier_id: &'a str,
    order: &'a str,
}

/// `POST /orders/{order}/tracking-token`.
#[derive(Debug, Deserialize)]
struct TokenRequest {
    #[serde(default)]
    viewer: Sent<String>,
}

/// Its answer, fields in alphabetical order (see [`Assigned`]).
#[derive(Debug, Serialize)]
struct TrackingToken<'a> {
    expires_at: u64,
    subprotocol: &'a str,
    token: &'a str,
    topic: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracking_url: Option<String>,
    viewer: &'a str,
    ws_url: &'a str,
}

/// `POST /orders/{order}/events`.
#[derive(Debug, Deserialize)]
struct EventRequest {
    #[serde(default)]
    event: Sent<String>,
}

/// Its answer (also the record a replay returns), fields in alphabetical order (see
/// [`Assigned`]).
#[derive(Debug, Serialize)]
struct EventDone<'a> {
    at: f64,
    event: &'a str,
    order: &'a str,
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
    let (_, req) = request::<AssignRequest>(body)?;
    let courier = req.courier_id.required("courier_id")?;
    if !valid_id(courier) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "courier ids are 1-64 of [A-Za-z0-9._:-]",
        ));
    }
    let tenant = match &req.tenant {
        Sent::Absent => "default",
        Sent::Given(t) if valid_id(t) => t.as_str(),
        _ => {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "tenant ids are 1-64 of [A-Za-z0-9._:-]",
            ))
        }
    };
    let pickup = place(&req.pickup, "pickup")?;
    let dropoff = place(&req.dropoff, "dropoff")?;
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
    Ok(Json(Assigned {
        courier_id: courier,
        order,
    })
    .into_response())
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
    let (_, req) = request::<TokenRequest>(body)?;
    let viewer = req.viewer.required("viewer")?;
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
    Ok(Json(TrackingToken {
        expires_at: claims.exp,
        subprotocol: crate::SUBPROTOCOL,
        token: &token,
        topic: courier_wire::track_topic(order),
        // Order ids and tokens are URL-safe as they are (valid_id; base64url JWT).
        tracking_url: api
            .tracking_page_url
            .as_ref()
            .map(|base| format!("{base}/track/{order}?token={token}")),
        viewer,
        ws_url: &api.ws_url,
    })
    .into_response())
}

async fn event(
    State(api): State<Arc<OrdersApi>>,
    Path(order): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let kind = match request::<EventRequest>(&body).map(|(_, r)| r.event) {
        Ok(Sent::Given(e)) if e == "picked_up" => "picked_up",
        Ok(Sent::Given(e)) if e == "delivered" => "delivered",
        _ => "unknown",
    };
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
    let (object, req) = request::<EventRequest>(body)?;
    let event = req.event.required("event")?;
    if !matches!(event, "picked_up" | "delivered") {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "event must be \"picked_up\" or \"delivered\"",
        ));
    }
    // The whole body, unknown fields included: serde_json's map is ordered by key, so the same
    // content gives the same fingerprint whatever its spacing or field order.
    let fingerprint = serde_json::to_string(&object).expect("a JSON object serializes");
    let now = courier_wire::clock::unix_now();
    let answer = serde_json::to_string(&EventDone {
        at: now,
        event,
        order,
    })
    .expect("an answer serializes");
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

    fn message(r: Refused) -> String {
        r.answer.message
    }

    #[test]
    fn bodies_must_be_objects_with_string_fields() {
        assert!(json_object(b"[1]").is_err());
        assert!(json_object(b"nope").is_err());
        let (_, r) = request::<EventRequest>(br#"{"event":"delivered","n":1}"#).unwrap();
        assert_eq!(r.event.required("event").unwrap(), "delivered");
        // Not a string, null, or absent: one refusal naming the field.
        for body in [r#"{"event":5}"#, r#"{"event":null}"#, r#"{"n":1}"#] {
            let (_, r) = request::<EventRequest>(body.as_bytes()).unwrap();
            assert_eq!(
                message(r.event.required("event").unwrap_err()),
                "missing string field \"event\"",
                "{body}"
            );
        }
        // A key given twice: the last counts, as with the parsed object before.
        let (_, r) = request::<EventRequest>(br#"{"event":"x","event":"delivered"}"#).unwrap();
        assert_eq!(r.event.required("event").unwrap(), "delivered");
    }

    #[test]
    fn tenants_and_places_are_absent_given_or_refused() {
        let (_, r) = request::<AssignRequest>(
            br#"{"courier_id":"c1","pickup":{"lat":24.7,"lon":46,"name":"x"}}"#,
        )
        .unwrap();
        assert!(matches!(r.tenant, Sent::Absent));
        assert_eq!(place(&r.pickup, "pickup").unwrap(), Some((24.7, 46.0)));
        assert_eq!(place(&r.dropoff, "dropoff").unwrap(), None);
        // A null tenant is not an absent one.
        let (_, r) = request::<AssignRequest>(br#"{"courier_id":"c1","tenant":null}"#).unwrap();
        assert!(matches!(r.tenant, Sent::Other(_)));
        for bad in [
            r#"[24.7, 46.7]"#,
            r#"{"lat":24.7}"#,
            r#"{"lat":"24.7","lon":46.7}"#,
            r#"{"lat":0,"lon":0}"#,
            r#"{"lat":91,"lon":46.7}"#,
            r#"null"#,
        ] {
            let body = format!(r#"{{"courier_id":"c1","dropoff":{bad}}}"#);
            let (_, r) = request::<AssignRequest>(body.as_bytes()).unwrap();
            assert_eq!(
                message(place(&r.dropoff, "dropoff").unwrap_err()),
                r#"dropoff must be {"lat": -90..90, "lon": -180..180}"#,
                "{bad}"
            );
        }
    }

    /// The typed answers write the bytes `json!` wrote before them.
    #[test]
    fn answers_keep_their_bytes() {
        fn s<T: Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap()
        }
        assert_eq!(
            s(&Assigned {
                courier_id: "c1",
                order: "o1"
            }),
            serde_json::json!({ "order": "o1", "courier_id": "c1" }).to_string()
        );
        let mut old = serde_json::json!({
            "token": "t.k.n",
            "expires_at": 1_796_025_600u64,
            "topic": "track/o1",
            "ws_url": "ws://127.0.0.1:8083/mqtt",
            "subprotocol": crate::SUBPROTOCOL,
            "viewer": "customer",
        });
        let mut new = TrackingToken {
            expires_at: 1_796_025_600,
            subprotocol: crate::SUBPROTOCOL,
            token: "t.k.n",
            topic: "track/o1".into(),
            tracking_url: None,
            viewer: "customer",
            ws_url: "ws://127.0.0.1:8083/mqtt",
        };
        assert_eq!(s(&new), old.to_string());
        old["tracking_url"] = serde_json::json!("http://x/track/o1?token=t.k.n");
        new.tracking_url = Some("http://x/track/o1?token=t.k.n".into());
        assert_eq!(s(&new), old.to_string());
        assert_eq!(
            s(&EventDone {
                at: 1_796_025_600.25,
                event: "delivered",
                order: "o1"
            }),
            serde_json::json!({ "order": "o1", "event": "delivered", "at": 1_796_025_600.25 })
                .to_string()
        );
    }
}
