//! HTTP requests to the pipeline under test, through the project's one client
//! ([`courier_wire::http_client`]); a test that is about raw bytes on the socket (slow headers,
//! oversized bodies) writes them itself.

use super::*;
use courier_wire::http_client::{Answer, HttpClient};

/// A client for one test call: 30 s, 16 MiB.
fn client() -> HttpClient {
    HttpClient::new(Duration::from_secs(30), 16 << 20)
}

fn bearer_header(bearer: Option<&str>) -> Option<String> {
    bearer.map(|t| format!("Bearer {t}"))
}

/// A response as received.
pub struct HttpReply {
    pub status: u16,
    /// The headers as `name: value` lines (lower-case names).
    pub head: String,
    pub body: String,
}

impl HttpReply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// GET over a real socket.
pub async fn http_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> HttpReply {
    let auth = bearer_header(bearer);
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let a = client()
        .get(&format!("http://{addr}{path}"), &headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let head = head_lines(&a);
    HttpReply {
        status: a.status,
        head,
        body: a.text(),
    }
}

fn head_lines(a: &Answer) -> String {
    a.headers
        .iter()
        .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// An HTTP answer: status, headers (lower-case names), JSON body (Null when not JSON).
#[derive(Debug)]
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
    pub raw_body: String,
}

impl HttpAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A POST with a JSON body and extra headers.
pub async fn http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpAnswer {
    let a = client()
        .post_json(&format!("http://{addr}{path}"), headers, body.to_string())
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let raw_body = a.text();
    HttpAnswer {
        status: a.status,
        headers: a
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: serde_json::from_str(&raw_body).unwrap_or(serde_json::Value::Null),
        raw_body,
    }
}

/// `GET path` from synchronous code (or from inside a runtime without awaiting): status and
/// body, `None` while nothing answers (`common::http_get`, the benches' helper, underneath).
pub fn get_blocking(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    crate::common::http_get(&format!("http://{addr}{path}")).map(|a| (a.status, a.text()))
}
