//! The Standard Webhooks wire format (<https://www.standardwebhooks.com/>): what is sent for
//! one event, and its signature. Signing is the specification's own Rust library
//! (`standardwebhooks`), the one consumers verify with; what is written here is the body and
//! the secret format.
//!
//! - body: `{"type": "<kind>", "timestamp": "<RFC 3339>", "data": {"order_id", "courier_id",
//!   "tenant"}}` (the kind and the time of the event, not of the attempt);
//! - `webhook-id`: `evt_<outbox id>`, the same on every retry and replay, so a consumer
//!   dedupes on it;
//! - `webhook-timestamp`: the attempt's unix seconds (receivers refuse ones older than 5 min);
//! - `webhook-signature`: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`;
//! - secret: `whsec_<base64 of 32 random bytes>`, one per endpoint, shown once at registration.

use base64::Engine as _;
use rand::RngCore as _;
use serde::Serialize;

/// One event as the outbox holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    /// The outbox row id.
    pub id: i64,
    pub kind: String,
    pub tenant: String,
    pub order_id: String,
    pub courier_id: Option<String>,
    /// Unix seconds.
    pub occurred_at: f64,
}

/// The headers and body of one attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Message {
    pub id: String,
    pub timestamp: i64,
    pub signature: String,
    pub body: Vec<u8>,
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    timestamp: String,
    data: Data<'a>,
}

#[derive(Serialize)]
struct Data<'a> {
    order_id: &'a str,
    courier_id: Option<&'a str>,
    tenant: &'a str,
}

/// A new endpoint secret.
pub(crate) fn new_secret() -> String {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// The webhook id of an event: stable across retries.
pub(crate) fn message_id(event_id: i64) -> String {
    format!("evt_{event_id}")
}

/// RFC 3339 in UTC with milliseconds, from unix seconds.
fn rfc3339(unix: f64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix.max(0.0));
    humantime::format_rfc3339_millis(t).to_string()
}

/// The body of an event.
pub(crate) fn body(e: &Event) -> Vec<u8> {
    serde_json::to_vec(&Body {
        kind: &e.kind,
        timestamp: rfc3339(e.occurred_at),
        data: Data {
            order_id: &e.order_id,
            courier_id: e.courier_id.as_deref(),
            tenant: &e.tenant,
        },
    })
    .expect("the body serializes")
}

/// Signs one attempt at `now` (unix seconds). Fails only on a malformed secret, which the API
/// never stores.
pub(crate) fn message(
    secret: &str,
    e: &Event,
    now: i64,
) -> Result<Message, standardwebhooks::WebhookError> {
    let id = message_id(e.id);
    let body = body(e);
    let signature = standardwebhooks::Webhook::new(secret)?.sign(&id, now, &body)?;
    Ok(Message {
        id,
        timestamp: now,
        signature,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Event {
        Event {
            id: 42,
            kind: "order.delivered".into(),
            tenant: "acme".into(),
            order_id: "o-1".into(),
            courier_id: Some("c-9".into()),
            occurred_at: 1_700_000_000.25,
        }
    }

    #[test]
    fn the_body_is_the_standard_envelope() {
        let v: serde_json::Value = serde_json::from_slice(&body(&event())).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "order.delivered", "timestamp": "2023-11-14T22:13:20.250Z",
                "data": {"order_id": "o-1", "courier_id": "c-9", "tenant": "acme"}})
        );
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400.0), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn a_message_verifies_with_the_specification_library_and_not_with_another_secret() {
        let secret = new_secret();
        assert!(secret.starts_with("whsec_") && secret.len() == 6 + 44);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let m = message(&secret, &event(), now).unwrap();
        assert_eq!(m.id, "evt_42");
        let mut h = axum::http::HeaderMap::new();
        h.insert("webhook-id", m.id.parse().unwrap());
        h.insert(
            "webhook-timestamp",
            m.timestamp.to_string().parse().unwrap(),
        );
        h.insert("webhook-signature", m.signature.parse().unwrap());
        let wh = standardwebhooks::Webhook::new(&secret).unwrap();
        wh.verify(&m.body, &h).unwrap();
        let other = standardwebhooks::Webhook::new(&new_secret()).unwrap();
        assert!(other.verify(&m.body, &h).is_err());
        let mut tampered = m.body.clone();
        tampered[10] ^= 1;
        assert!(wh.verify(&tampered, &h).is_err());
    }
}
