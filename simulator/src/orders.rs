//! The orders API as the order service calls it (the edge of [`crate::watchers::Assigner::Api`]):
//! `POST /orders/{order}/assign`, `/tracking-token` and `/events`, each with
//! `Authorization: Bearer <SERVICE_KEY>`, through the project's HTTP client
//! ([`courier_wire::http_client`], hyper underneath).
//!
//! `http://` only: the simulator runs beside the pipeline; put a TLS terminator's plain side
//! in front of it otherwise.

use crate::SimError;
use courier_wire::http_client::{Answer, HttpClient, HttpError};
use serde::Deserialize;
use std::time::Duration;

/// Longest an API call may take (connect, send, answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read; the API's answers are a few hundred bytes.
const MAX_ANSWER: usize = 64 * 1024;
/// Attempts of a call that failed in a retryable way (I/O, 503).
const ATTEMPTS: u32 = 3;

/// Where the orders API is and the key it wants.
#[derive(Debug, Clone)]
pub(crate) struct OrdersApi {
    /// `http://host:port[/prefix]` without a trailing slash.
    base_url: String,
    /// `Bearer <SERVICE_KEY>`.
    authorization: String,
    client: HttpClient,
}

/// What a customer needs to watch one order (the `tracking-token` answer).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub(crate) struct Ticket {
    pub token: String,
    pub topic: String,
    pub ws_url: String,
}

impl OrdersApi {
    /// `base_url` is `http://host:port` with an optional path prefix.
    pub(crate) fn new(base_url: &str, service_key: &str) -> Result<OrdersApi, SimError> {
        let base_url = check_base_url(base_url).map_err(SimError::Config)?;
        if service_key.is_empty() {
            return Err(SimError::Config(
                "the orders API needs a service key (SERVICE_KEY)".into(),
            ));
        }
        Ok(OrdersApi {
            base_url,
            authorization: format!("Bearer {service_key}"),
            client: HttpClient::new(CALL_TIMEOUT, MAX_ANSWER),
        })
    }

    /// The courier now carries the order.
    pub(crate) async fn assign(&self, order: &str, courier: &str) -> Result<(), SimError> {
        let body = serde_json::json!({ "courier_id": courier }).to_string();
        self.expect_ok("assign", order, body, None).await.map(drop)
    }

    /// A customer's tracking token for the order, with its topic and WebSocket URL.
    pub(crate) async fn tracking_token(&self, order: &str) -> Result<Ticket, SimError> {
        let a = self
            .expect_ok(
                "tracking-token",
                order,
                r#"{"viewer":"customer"}"#.into(),
                None,
            )
            .await?;
        serde_json::from_slice(&a.body).map_err(|e| SimError::Api {
            status: Some(a.status),
            message: format!("tracking-token answer is not the expected JSON: {e}"),
        })
    }

    /// Ends the order (`delivered`); a replay of the same key is answered alike, so a retry
    /// after a lost answer is safe.
    pub(crate) async fn delivered(&self, order: &str) -> Result<(), SimError> {
        let key = format!("sim:{order}:delivered");
        self.expect_ok(
            "events",
            order,
            r#"{"event":"delivered"}"#.into(),
            Some(key.as_str()),
        )
        .await
        .map(drop)
    }

    /// POSTs `/orders/{order}/{call}`, retrying I/O failures and 503; anything but 200 is an error.
    async fn expect_ok(
        &self,
        call: &str,
        order: &str,
        body: String,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, SimError> {
        let url = format!("{}/orders/{order}/{call}", self.base_url);
        let mut headers = vec![("authorization", self.authorization.as_str())];
        if let Some(k) = idempotency_key {
            headers.push(("idempotency-key", k));
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r = match self.client.post_json(&url, &headers, body.clone()).await {
                Ok(a) if a.status == 200 => return Ok(a),
                Ok(a) => Err(SimError::Api {
                    status: Some(a.status),
                    message: format!("POST {url}: {} {}", a.status, a.text().trim()),
                }),
                Err(HttpError::Request(m)) => Err(SimError::Config(m)),
                Err(e) => Err(SimError::Api {
                    status: None,
                    message: e.to_string(),
                }),
            };
            match r {
                Err(e) if e.is_retryable() && attempt < ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "orders API call failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
                r => return r,
            }
        }
    }
}

/// `http://host:port[/prefix]`, checked once at start-up; returned without a trailing slash.
fn check_base_url(url: &str) -> Result<String, String> {
    let bad =
        || format!("orders API URL {url:?}: expected http://host:port (https is not supported)");
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() || path.contains(['?', '#', ' ']) {
        return Err(bad());
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_plain_http_with_a_port() {
        assert_eq!(
            check_base_url("http://127.0.0.1:8080").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            check_base_url("http://api.local:80/v1/").unwrap(),
            "http://api.local:80/v1"
        );
        assert!(check_base_url("https://x:443").is_err());
        assert!(check_base_url("http://x").is_err());
        assert!(check_base_url("http://:80").is_err());
        assert!(check_base_url("http://x:80/a?b").is_err());
        assert!(OrdersApi::new("http://x:80", "").is_err());
    }

    #[test]
    fn tickets_read_the_tracking_token_answer() {
        let t: Ticket = serde_json::from_str(
            r#"{"token":"t","expires_at":1,"topic":"track/o1","ws_url":"ws://h:1/mqtt","subprotocol":"mqtt","viewer":"customer"}"#,
        )
        .unwrap();
        assert_eq!(t.topic, "track/o1");
        assert_eq!(t.ws_url, "ws://h:1/mqtt");
    }
}
