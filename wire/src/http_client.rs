//! The one HTTP client of the project's own tools (the simulator's orders API calls,
//! `courier-pipeline health`, the tests and the benches): hyper's HTTP/1 client through
//! hyper-util's pooled connector, the same stack the notify dispatcher sends webhooks with, so
//! nothing here parses HTTP by hand. Plain `http://` only: these tools talk to the pipeline
//! beside them (webhooks to the outside world go through notify's TLS client).
//!
//! Every call is bounded: a whole-call timeout (connect, send, answer) and a largest answer
//! body, both set once per [`HttpClient`].

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

pub use hyper::HeaderMap;

/// Why a call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL or a header is not one this client can send (fatal: a retry cannot help).
    #[error("{0}")]
    Request(String),
    /// Connecting, sending or reading failed (retryable).
    #[error("{url}: {message}")]
    Io { url: String, message: String },
    /// No whole answer within the timeout (retryable).
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    /// The answer's body is larger than the client takes (fatal).
    #[error("{url}: answer body larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
}

impl HttpError {
    /// Whether trying again later may succeed.
    #[cfg(test)]
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, HttpError::Io { .. } | HttpError::Timeout { .. })
    }
}

/// An answer: status, headers and the whole body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The body as text (lossy: the answers read here are JSON or Prometheus text).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value as text, if present and printable.
    #[cfg(test)]
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A pooled HTTP/1.1 client with a timeout per call and a largest answer body.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    max_body: usize,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .finish()
    }
}

impl HttpClient {
    /// A client whose calls each finish within `timeout` and read at most `max_body` bytes.
    pub fn new(timeout: Duration, max_body: usize) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        HttpClient {
            inner: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            timeout,
            max_body,
        }
    }

    /// `GET url` with extra headers.
    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Answer, HttpError> {
        self.call(Method::GET, url, headers, Bytes::new()).await
    }

    /// `POST url` with a JSON body and extra headers.
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, HttpError> {
        let mut all = Vec::with_capacity(headers.len() + 1);
        all.push(("content-type", "application/json"));
        all.extend_from_slice(headers);
        self.call(Method::POST, url, &all, body.into()).await
    }

    /// Any method, headers and body; the answer whatever its status.
    pub(crate) async fn call(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, HttpError> {
        let request = build(method, url, headers, body)?;
        let io = |e: &dyn std::fmt::Display| HttpError::Io {
            url: url.to_string(),
            message: e.to_string(),
        };
        let call = async {
            let answer = self.inner.request(request).await.map_err(|e| {
                // The connector's error says what failed (refused, reset); the outer one only
                // "client error (Connect)".
                match std::error::Error::source(&e) {
                    Some(inner) => io(&format!("{e}: {inner}")),
                    None => io(&e),
                }
            })?;
            let (parts, body) = answer.into_parts();
            let body = Limited::new(body, self.max_body)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        HttpError::TooLarge {
                            url: url.to_string(),
                            limit: self.max_body,
                        }
                    } else {
                        io(&e)
                    }
                })?
                .to_bytes();
            Ok(Answer {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(HttpError::Timeout {
                    url: url.to_string(),
                    timeout: self.timeout,
                })
            })
    }
}

/// The request for `url` (pure: what [`HttpClient::call`] sends).
fn build(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Request<Full<Bytes>>, HttpError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| HttpError::Request(format!("URL {url:?}: {e}")))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(HttpError::Request(format!(
            "URL {url:?}: expected http://host:port/path (https is not supported by this client)"
        )));
    }
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| HttpError::Request(format!("header name {name:?}: {e}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|e| HttpError::Request(format!("header {name}: {e}")))?;
        request = request.header(name, value);
    }
    request
        .body(Full::new(body))
        .map_err(|e| HttpError::Request(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_method_url_and_headers() {
        let r = build(
            Method::POST,
            "http://127.0.0.1:8080/v1/orders/o1/events",
            &[("authorization", "Bearer k"), ("idempotency-key", "sim:o1")],
            Bytes::from_static(b"{}"),
        )
        .unwrap();
        assert_eq!(r.method(), Method::POST);
        assert_eq!(r.uri().path(), "/v1/orders/o1/events");
        assert_eq!(r.uri().authority().unwrap().as_str(), "127.0.0.1:8080");
        assert_eq!(r.headers()["authorization"], "Bearer k");
        assert_eq!(r.headers()["idempotency-key"], "sim:o1");
    }

    #[test]
    fn only_plain_http_urls_with_a_host_are_sent() {
        for bad in ["https://x:443/", "x:80/a", "/path", "http://", "not a url"] {
            let e = build(Method::GET, bad, &[], Bytes::new()).unwrap_err();
            assert!(matches!(e, HttpError::Request(_)), "{bad}: {e}");
            assert!(!e.is_retryable());
        }
        let e = build(
            Method::GET,
            "http://x:1/",
            &[("bad name", "v")],
            Bytes::new(),
        );
        assert!(matches!(e, Err(HttpError::Request(_))));
        let e = build(
            Method::GET,
            "http://x:1/",
            &[("a", "line\nbreak")],
            Bytes::new(),
        );
        assert!(matches!(e, Err(HttpError::Request(_))));
    }

    #[tokio::test]
    async fn answers_are_read_whole_and_bounded() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A real peer on a socket: one answer by length, one chunked, one too large.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let answers: [&[u8]; 3] = [
                b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nx-a: b\r\n\r\n{}",
                b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n",
            ];
            for a in answers {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                s.write_all(a).await.unwrap();
                if a.ends_with(b"\r\n\r\n") {
                    s.write_all(&[b'x'; 100]).await.unwrap();
                }
                s.shutdown().await.unwrap();
            }
        });
        let c = HttpClient::new(Duration::from_secs(5), 64);
        let url = format!("http://{addr}/p");
        let a = c.post_json(&url, &[], "{}").await.unwrap();
        assert_eq!(
            (a.status, a.text().as_str(), a.header("x-a")),
            (201, "{}", Some("b"))
        );
        let a = c.get(&url, &[]).await.unwrap();
        assert_eq!((a.status, a.text().as_str()), (404, "abcde"));
        let e = c.get(&url, &[]).await.unwrap_err();
        assert!(matches!(e, HttpError::TooLarge { limit: 64, .. }), "{e}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_retryable() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let c = HttpClient::new(Duration::from_secs(5), 64);
        let e = c
            .get(&format!("http://127.0.0.1:{port}/"), &[])
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
    }
}
