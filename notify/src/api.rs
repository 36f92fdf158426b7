//! The webhooks API, for the order service, with the service key (`SERVICE_KEY`, as the orders
//! API). Every call names its tenant, and sees and changes only that tenant's endpoints.
//!
//! - `POST /webhooks/endpoints` `{"tenant", "url", "kinds": [...]}` -> 201 `{"id", "secret", ...}`:
//!   the secret (`whsec_...`) is shown here only;
//! - `GET /webhooks/endpoints?tenant=` -> the tenant's endpoints (breaker state, no secrets);
//! - `DELETE /webhooks/endpoints/{id}?tenant=` -> 204: no more deliveries to it;
//! - `GET /webhooks/dead-letters?tenant=&limit=` -> deliveries given up on, newest first;
//! - `POST /webhooks/dead-letters/{id}/replay?tenant=` -> 202: in line again, as new;
//! - `POST /notices/devices` `{"tenant", "order_id", "token"}` -> 201: the customer's app on
//!   this device is notified of the order's events (`notify.push_kinds`), once each;
//! - `GET /notices?tenant=&order_id=` -> the order's notices and their states.

use crate::events::{self, KINDS};
use crate::outbox;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use courier_wire::ApiError;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::Mutex;

/// What the handlers share.
pub(crate) struct Api {
    pub database_url: String,
    pub service_key: String,
    db: Mutex<Option<Arc<tokio_postgres::Client>>>,
}

impl Api {
    pub(crate) fn new(database_url: String, service_key: String) -> Self {
        Api {
            database_url,
            service_key,
            db: Mutex::new(None),
        }
    }

    /// The shared client (queries of concurrent requests pipeline on it), reconnected when
    /// closed.
    async fn db(&self) -> Result<Arc<tokio_postgres::Client>, Refused> {
        let mut slot = self.db.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let mut c =
            history_writer::sink::connect(&self.database_url, "courier-pipeline webhooks api")
                .await
                .map_err(storage)?;
        history_writer::migrate(&mut c).await.map_err(storage)?;
        let c = Arc::new(c);
        *slot = Some(c.clone());
        Ok(c)
    }
}

pub(crate) fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/webhooks/endpoints", post(create).get(list))
        .route("/webhooks/endpoints/{id}", delete(disable))
        .route("/webhooks/dead-letters", get(dead_letters))
        .route("/webhooks/dead-letters/{id}/replay", post(replay))
        .route("/notices/devices", post(register_device))
        .route("/notices", get(list_notices))
        .layer(axum::extract::DefaultBodyLimit::max(8 * 1024))
        .with_state(api)
}

/// A refused call: status, metric label, message; answered as every API answers
/// ([`ApiError`]).
#[derive(Debug)]
pub(crate) struct Refused(StatusCode, &'static str, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        events::api(self.1);
        ApiError::new(self.0, self.2).into_response()
    }
}

fn bad(msg: impl Into<String>) -> Refused {
    Refused(StatusCode::BAD_REQUEST, "bad_request", msg.into())
}

fn storage(e: impl std::fmt::Display) -> Refused {
    tracing::warn!(error = %e, "webhooks API: postgres call failed");
    Refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "error",
        "storage unavailable, retry later".into(),
    )
}

fn ok(status: StatusCode, body: serde_json::Value) -> Response {
    events::api("ok");
    (status, Json(body)).into_response()
}

fn check_key(api: &Api, headers: &HeaderMap) -> Result<(), Refused> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(courier_auth::bearer_credential);
    match presented {
        Some(k) if courier_auth::same_secret(k.as_bytes(), api.service_key.as_bytes()) => Ok(()),
        _ => Err(Refused(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid service key is required (Authorization: Bearer)".into(),
        )),
    }
}

fn check_tenant(t: &str) -> Result<(), Refused> {
    if courier_wire::topic::valid_id(t) {
        Ok(())
    } else {
        Err(bad("tenant ids are 1-64 of [A-Za-z0-9._:-]"))
    }
}

/// An endpoint URL: absolute `http`/`https` with a host, no credentials, at most 2 KiB.
pub(crate) fn check_url(url: &str) -> Result<(), &'static str> {
    if url.len() > 2048 {
        return Err("url is longer than 2048 bytes");
    }
    let uri: Uri = url.parse().map_err(|_| "url is not a URL")?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("url must be http:// or https://");
    }
    let authority = uri.authority().ok_or("url has no host")?;
    if authority.as_str().contains('@') {
        return Err("url must not carry credentials");
    }
    if authority.host().is_empty() {
        return Err("url has no host");
    }
    Ok(())
}

/// A call that presented the service key, and the database to answer it.
struct Service {
    db: Arc<tokio_postgres::Client>,
}

impl FromRequestParts<Arc<Api>> for Service {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> Result<Self, Refused> {
        check_key(api, &parts.headers)?;
        Ok(Service {
            db: api.db().await?,
        })
    }
}

/// A [`Service`] call naming its tenant in the query (`?tenant=`), with the rest of the query.
struct TenantCall {
    db: Arc<tokio_postgres::Client>,
    tenant: String,
    query: TenantQuery,
}

#[derive(Deserialize)]
struct TenantQuery {
    tenant: Option<String>,
    limit: Option<i64>,
    order_id: Option<String>,
}

impl FromRequestParts<Arc<Api>> for TenantCall {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> Result<Self, Refused> {
        let Service { db } = Service::from_request_parts(parts, api).await?;
        let Query(query) = Query::<TenantQuery>::try_from_uri(&parts.uri)
            .map_err(|e| bad(format!("query: {}", e.body_text())))?;
        let tenant = query
            .tenant
            .clone()
            .ok_or_else(|| bad("`tenant` is required"))?;
        check_tenant(&tenant)?;
        Ok(TenantCall { db, tenant, query })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewEndpoint {
    tenant: String,
    url: String,
    kinds: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewDevice {
    tenant: String,
    order_id: String,
    token: String,
}

fn body<T: serde::de::DeserializeOwned>(raw: &[u8], shape: &str) -> Result<T, Refused> {
    serde_json::from_slice(raw).map_err(|e| bad(format!("body: {e} (expected {shape})")))
}

async fn create(call: Service, raw: axum::body::Bytes) -> Result<Response, Refused> {
    let e: NewEndpoint = body(&raw, r#"{"tenant", "url", "kinds": [...]}"#)?;
    check_tenant(&e.tenant)?;
    check_url(&e.url).map_err(bad)?;
    if e.kinds.is_empty() {
        return Err(bad(format!("kinds must name at least one of {KINDS:?}")));
    }
    if let Some(k) = e.kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
        return Err(bad(format!("unknown kind {k:?}: one of {KINDS:?}")));
    }
    let secret = crate::sign::new_secret();
    let id = outbox::create_endpoint(&call.db, &e.tenant, &e.url, &e.kinds, &secret)
        .await
        .map_err(storage)?;
    Ok(ok(
        StatusCode::CREATED,
        json!({"id": id, "tenant": e.tenant, "url": e.url, "kinds": e.kinds, "secret": secret}),
    ))
}

async fn list(call: TenantCall) -> Result<Response, Refused> {
    let list = outbox::endpoints(&call.db, &call.tenant)
        .await
        .map_err(storage)?;
    Ok(ok(StatusCode::OK, json!({ "endpoints": list })))
}

fn not_found(what: &str) -> Refused {
    Refused(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no such {what} of this tenant"),
    )
}

async fn disable(call: TenantCall, Path(id): Path<i64>) -> Result<Response, Refused> {
    if !outbox::disable_endpoint(&call.db, &call.tenant, id)
        .await
        .map_err(storage)?
    {
        return Err(not_found("endpoint"));
    }
    events::api("ok");
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn dead_letters(call: TenantCall) -> Result<Response, Refused> {
    let limit = call.query.limit.unwrap_or(100).clamp(1, 1000);
    let list = outbox::dead_letters(&call.db, &call.tenant, limit)
        .await
        .map_err(storage)?;
    Ok(ok(StatusCode::OK, json!({ "dead_letters": list })))
}

async fn replay(call: TenantCall, Path(id): Path<i64>) -> Result<Response, Refused> {
    if !outbox::replay(&call.db, &call.tenant, id)
        .await
        .map_err(storage)?
    {
        return Err(not_found("dead letter"));
    }
    Ok(ok(
        StatusCode::ACCEPTED,
        json!({ "delivery_id": id, "state": "pending" }),
    ))
}

async fn register_device(call: Service, raw: axum::body::Bytes) -> Result<Response, Refused> {
    let d: NewDevice = body(&raw, r#"{"tenant", "order_id", "token"}"#)?;
    check_tenant(&d.tenant)?;
    if !courier_wire::topic::valid_id(&d.order_id) {
        return Err(bad("order ids are 1-64 of [A-Za-z0-9._:-]"));
    }
    if d.token.is_empty() || d.token.len() > 4096 || !d.token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad("token must be 1-4096 visible ASCII characters"));
    }
    let (id, retired) = outbox::register_device(&call.db, &d.tenant, &d.order_id, &d.token)
        .await
        .map_err(storage)?;
    Ok(ok(
        StatusCode::CREATED,
        json!({ "device_id": id, "order_id": d.order_id, "retired": retired }),
    ))
}

async fn list_notices(call: TenantCall) -> Result<Response, Refused> {
    let order = call
        .query
        .order_id
        .as_deref()
        .filter(|o| courier_wire::topic::valid_id(o));
    let order = order.ok_or_else(|| bad("`order_id` is required"))?;
    let list = outbox::notices(&call.db, &call.tenant, order)
        .await
        .map_err(storage)?;
    let list: Vec<_> = list
        .into_iter()
        .map(|(device, kind, state, attempts)| {
            json!({ "device_id": device, "kind": kind, "state": state, "attempts": attempts })
        })
        .collect();
    Ok(ok(StatusCode::OK, json!({ "notices": list })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls() {
        assert!(check_url("https://hooks.example.com/courier?x=1").is_ok());
        assert!(check_url("http://127.0.0.1:9000/").is_ok());
        assert!(check_url("ftp://example.com/").is_err());
        assert!(check_url("https://user:pw@example.com/").is_err());
        assert!(check_url("/relative").is_err());
        assert!(check_url(&format!("https://e.com/{}", "a".repeat(2100))).is_err());
    }
}
