//! The pages and their bundles, built into the binary (`web/assets/`, made by `./dev web` from
//! `web/ui/`): served with their content types, an ETag and cache headers. HTML is never
//! cached without revalidation (it carries the configuration); the bundles are revalidated
//! every hour, and answered 304 by ETag.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One embedded file.
pub struct Asset {
    pub name: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

/// The bundles under `/maps/assets/`.
pub const BUNDLES: &[Asset] = &[
    Asset {
        name: "ops.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/ops.js"),
    },
    Asset {
        name: "ops.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../assets/ops.css"),
    },
    Asset {
        name: "track.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../assets/track.js"),
    },
    Asset {
        name: "track.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../assets/track.css"),
    },
];

/// The page templates; `<!--CONFIG-->` becomes the page's settings.
pub(crate) const OPS_HTML: &str = include_str!("../assets/ops.html");
pub(crate) const TRACK_HTML: &str = include_str!("../assets/track.html");

pub(crate) fn find(name: &str) -> Option<&'static Asset> {
    BUNDLES.iter().find(|a| a.name == name)
}

/// A strong ETag of `bytes` (FNV-1a: identity, not security).
pub(crate) fn etag(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("\"{h:016x}\"")
}

/// The HTML of a page with its settings in a JSON script element. `<`, `>` and `&` are escaped
/// so no value (a tile URL, an attribution) can close the element.
pub(crate) fn render(template: &str, config: &serde_json::Value) -> String {
    let json = config
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    template.replace(
        "<!--CONFIG-->",
        &format!("<script id=\"config\" type=\"application/json\">{json}</script>"),
    )
}

/// Headers every answer of the maps carries. `no-referrer`: the pages' URLs hold tokens, which
/// must not reach a tile server in a Referer.
pub(crate) fn common_headers(h: &mut HeaderMap) {
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// `bytes` as `content_type`, or 304 when the client holds this version.
pub(crate) fn serve(
    req: &HeaderMap,
    content_type: &'static str,
    cache: &'static str,
    etag: &str,
    bytes: impl Into<axum::body::Body>,
    extra: &[(header::HeaderName, String)],
) -> Response {
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = bytes.into().into_response();
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    };
    let h = r.headers_mut();
    common_headers(h);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k.clone(), v);
        }
    }
    r
}

/// The sha256 lines a bundle's header records (`// sources-sha256: ...`), for the drift test.
pub fn recorded_sources_hash(bundle: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(&bundle[..bundle.len().min(512)]).ok()?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("/* sources-sha256: "))
        .and_then(|l| l.strip_suffix(" */"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_escapes_what_could_close_the_script() {
        let html = render(
            "<head><!--CONFIG--></head>",
            &serde_json::json!({"attribution": "</script><script>alert(1)</script>&"}),
        );
        assert!(!html.contains("</script><script>alert"));
        assert_eq!(html.matches("</script>").count(), 1);
        assert!(html.contains("\\u003c/script\\u003e"));
    }

    #[test]
    fn every_bundle_is_embedded_with_a_type_and_a_header() {
        for a in BUNDLES {
            assert!(a.bytes.len() > 1000, "{} looks empty", a.name);
            assert!(
                recorded_sources_hash(a.bytes).is_some(),
                "{} has no sources-sha256 header: rebuild with ./dev web",
                a.name
            );
        }
        assert!(OPS_HTML.contains("<!--CONFIG-->") && TRACK_HTML.contains("<!--CONFIG-->"));
        assert_ne!(etag(b"a"), etag(b"b"));
    }
}
