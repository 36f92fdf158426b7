//! The one shape of a refused HTTP call, shared by every API of the pipeline (orders, trail and
//! aggregates, erasure, webhooks, maps, and the server's own time limit): its status and
//! `{"error": "<message>"}`, plus `WWW-Authenticate: Bearer` on a 401 (RFC 6750 §3), so that
//! clients parse one body whichever API refused them. What each API counts stays in the API.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// A refused call: the status and the message the caller reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

/// The body, exactly `{"error":"..."}` (the documented contract).
#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(Body {
                error: &self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(e: ApiError) -> (StatusCode, Option<String>, Option<String>, String) {
        let r = e.into_response();
        let h = |n| {
            r.headers()
                .get(n)
                .map(|v: &HeaderValue| v.to_str().unwrap().to_string())
        };
        let (status, ctype, auth) = (
            r.status(),
            h(header::CONTENT_TYPE),
            h(header::WWW_AUTHENTICATE),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = rt
            .block_on(axum::body::to_bytes(r.into_body(), 1 << 16))
            .unwrap();
        (
            status,
            ctype,
            auth,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[test]
    fn the_body_is_one_error_field_and_a_401_names_the_bearer_scheme() {
        let (s, ctype, auth, body) = parts(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required",
        ));
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert_eq!(ctype.as_deref(), Some("application/json"));
        assert_eq!(auth.as_deref(), Some("Bearer"));
        assert_eq!(body, r#"{"error":"a valid bearer token is required"}"#);
        // Quotes and control characters are escaped as JSON; no other status gets the header.
        let (s, _, auth, body) = parts(ApiError::new(StatusCode::BAD_REQUEST, "bad \"x\"\n"));
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(auth, None);
        assert_eq!(body, r#"{"error":"bad \"x\"\n"}"#);
    }
}
