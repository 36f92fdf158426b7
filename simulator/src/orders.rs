//! The orders API as the order service calls it (the edge of [`crate::watchers::Assigner::Api`]):
//! `POST /orders/{order}/assign`, `/tracking-token` and `/events`, each with
//! `Authorization: Bearer <SERVICE_KEY>`, over plain HTTP/1.1 (one request per connection; the
//! simulator makes a few calls per watched order, so a pooled client would buy nothing).
//!
//! `http://` only: the simulator runs beside the pipeline; put a TLS terminator's plain side
//! in front of it otherwise. The request/answer text is built and parsed by pure functions.

use crate::SimError;
use serde::Deserialize;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest an API call may take (connect, send, answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read; the API's answers are a few hundred bytes.
const MAX_ANSWER: usize = 64 * 1024;
/// Attempts of a call that failed in a retryable way (I/O, 503).
const ATTEMPTS: u32 = 3;

/// Where the orders API is and the key it wants.
#[derive(Debug, Clone)]
pub struct OrdersApi {
    /// `host:port`, for the connection and the `Host` header.
    authority: String,
    /// Path before `/orders/...` (empty, or `/prefix` without a trailing slash).
    base_path: String,
    service_key: String,
}

/// What a customer needs to watch one order (the `tracking-token` answer).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Ticket {
    pub token: String,
    pub topic: String,
    pub ws_url: String,
}

/// An HTTP answer: status and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl OrdersApi {
    /// `base_url` is `http://host:port` with an optional path prefix.
    pub fn new(base_url: &str, service_key: &str) -> Result<OrdersApi, SimError> {
        let (authority, base_path) = parse_base_url(base_url).map_err(SimError::Config)?;
        if service_key.is_empty() {
            return Err(SimError::Config(
                "the orders API needs a service key (SERVICE_KEY)".into(),
            ));
        }
        Ok(OrdersApi {
            authority,
            base_path,
            service_key: service_key.to_string(),
        })
    }

    /// The courier now carries the order.
    pub async fn assign(&self, order: &str, courier: &str) -> Result<(), SimError> {
        let body = serde_json::json!({ "courier_id": courier }).to_string();
        self.expect_ok("assign", order, &body, None).await.map(drop)
    }

    /// A customer's tracking token for the order, with its topic and WebSocket URL.
    pub async fn tracking_token(&self, order: &str) -> Result<Ticket, SimError> {
        let a = self
            .expect_ok("tracking-token", order, r#"{"viewer":"customer"}"#, None)
            .await?;
        serde_json::from_slice(&a.body).map_err(|e| SimError::Api {
            status: Some(a.status),
            message: format!("tracking-token answer is not the expected JSON: {e}"),
        })
    }

    /// Ends the order (`delivered`); a replay of the same key is answered alike, so a retry
    /// after a lost answer is safe.
    pub async fn delivered(&self, order: &str) -> Result<(), SimError> {
        let key = format!("sim:{order}:delivered");
        self.expect_ok(
            "events",
            order,
            r#"{"event":"delivered"}"#,
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
        body: &str,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, SimError> {
        let path = format!("{}/orders/{order}/{call}", self.base_path);
        let request = post_request(
            &self.authority,
            &path,
            &self.service_key,
            idempotency_key,
            body,
        );
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r = match self.send(&request).await {
                Ok(a) if a.status == 200 => return Ok(a),
                Ok(a) => Err(SimError::Api {
                    status: Some(a.status),
                    message: format!(
                        "POST {path}: {} {}",
                        a.status,
                        String::from_utf8_lossy(&a.body).trim()
                    ),
                }),
                Err(e) => Err(e),
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

    async fn send(&self, request: &[u8]) -> Result<Answer, SimError> {
        let io = |e: std::io::Error| SimError::Api {
            status: None,
            message: format!("{}: {e}", self.authority),
        };
        let call = async {
            let mut s = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(io)?;
            let _ = s.set_nodelay(true);
            s.write_all(request).await.map_err(io)?;
            let mut raw = Vec::new();
            (&mut s)
                .take(MAX_ANSWER as u64 + 1)
                .read_to_end(&mut raw)
                .await
                .map_err(io)?;
            if raw.len() > MAX_ANSWER {
                return Err(SimError::Api {
                    status: None,
                    message: format!("{}: answer larger than {MAX_ANSWER} bytes", self.authority),
                });
            }
            parse_answer(&raw).map_err(|m| SimError::Api {
                status: None,
                message: format!("{}: {m}", self.authority),
            })
        };
        tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Err(SimError::Api {
                    status: None,
                    message: format!("{}: no answer within {CALL_TIMEOUT:?}", self.authority),
                })
            })
    }
}

/// `http://host:port[/prefix]` -> (`host:port`, `/prefix` or empty).
fn parse_base_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("orders API URL {url:?}: expected http://host:port (https is not supported)")
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let bad = || format!("orders API URL {url:?}: expected http://host:port");
    let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() || path.contains(['?', '#', ' ']) {
        return Err(bad());
    }
    Ok((authority.to_string(), path.to_string()))
}

/// The bytes of one POST with a JSON body, closing the connection after the answer.
fn post_request(
    authority: &str,
    path: &str,
    service_key: &str,
    idempotency_key: Option<&str>,
    body: &str,
) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {service_key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(k) = idempotency_key {
        r.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// Parses a whole HTTP/1.1 answer (read until the server closed): status and body, the body
/// cut to `Content-Length` or de-chunked.
fn parse_answer(raw: &[u8]) -> Result<Answer, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("answer without a header end")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "answer head is not UTF-8")?;
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .filter(|l| l.starts_with("HTTP/1."))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or("answer without a status line")?;
    let (mut length, mut chunked) = (None, false);
    for l in lines {
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else if let Some(n) = length {
        body.get(..n)
            .ok_or("answer shorter than its Content-Length")?
            .to_vec()
    } else {
        body.to_vec()
    };
    Ok(Answer { status, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size without an end")?;
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .ok_or("bad chunk size")?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(b.get(..size).ok_or("chunk cut short")?);
        b = b.get(size + 2..).ok_or("chunk cut short")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_give_authority_and_path() {
        assert_eq!(
            parse_base_url("http://127.0.0.1:8080").unwrap(),
            ("127.0.0.1:8080".into(), "".into())
        );
        assert_eq!(
            parse_base_url("http://api.local:80/v1/").unwrap(),
            ("api.local:80".into(), "/v1".into())
        );
        assert!(parse_base_url("https://x:443").is_err());
        assert!(parse_base_url("http://x").is_err());
        assert!(parse_base_url("http://:80").is_err());
        assert!(parse_base_url("http://x:80/a?b").is_err());
        assert!(OrdersApi::new("http://x:80", "").is_err());
    }

    #[test]
    fn requests_carry_the_key_the_length_and_the_idempotency_key() {
        let r = post_request("h:1", "/orders/o1/events", "k", Some("sim:o1"), "{}");
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with("POST /orders/o1/events HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(text.contains("Authorization: Bearer k\r\n"));
        assert!(text.contains("Content-Length: 2\r\n"));
        assert!(text.contains("Idempotency-Key: sim:o1\r\n"));
        assert!(text.ends_with("\r\n\r\n{}"));
        let r = String::from_utf8(post_request("h:1", "/p", "k", None, "")).unwrap();
        assert!(!r.contains("Idempotency-Key"));
    }

    #[test]
    fn answers_are_parsed_by_length_or_chunks() {
        let a = parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}trailing").unwrap();
        assert_eq!(
            a,
            Answer {
                status: 200,
                body: b"{}".to_vec()
            }
        );
        let a = parse_answer(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((a.status, a.body), (404, b"abcde".to_vec()));
        let a = parse_answer(b"HTTP/1.0 503 x\r\n\r\nbusy").unwrap();
        assert_eq!((a.status, a.body), (503, b"busy".to_vec()));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_answer(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{}").is_err());
        assert!(
            parse_answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
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
