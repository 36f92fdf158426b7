//! The live maps (web crate) on a free port, with the trail API beside them when given a
//! database, as `run` merges them on HTTP_LISTEN.

use super::*;

pub struct RunningMaps {
    pub http: SocketAddr,
    shutdown: CancellationToken,
}

impl RunningMaps {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    pub fn stop(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for RunningMaps {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves the maps on `listener` (bound by the caller, so its address can go into the fanout's
/// `tracking_page_url` before the maps know the gateway's address).
pub async fn start_maps_on(
    listener: tokio::net::TcpListener,
    keys: Keys,
    config: web::WebConfig,
    ws_url: String,
    trail_db: Option<&str>,
) -> RunningMaps {
    use courier_auth::Audience;
    let http = listener.local_addr().unwrap();
    let maps = web::Web {
        config,
        redis: services().redis(),
        keys,
        ops_keys: Some(test_verifier(Audience::Ops)),
        viewer_keys: Some(test_verifier(Audience::Viewer)),
        evict_after: Duration::from_secs(60),
        ws_url,
        metrics: None,
    }
    .router()
    .await
    .unwrap();
    let mut app = maps;
    if let Some(url) = trail_db {
        let trail = history_writer::Trail::new(
            url,
            test_verifier(Audience::Trail),
            &history_writer::HistoryConfig::default(),
            history_writer::system_clock(),
        )
        .unwrap()
        .with_ops_keys(test_verifier(Audience::Ops));
        app = app.merge(trail.router());
    }
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    RunningMaps { http, shutdown }
}

/// [`start_maps_on`] on a fresh port.
pub async fn start_maps(
    keys: Keys,
    config: web::WebConfig,
    ws_url: String,
    trail_db: Option<&str>,
) -> RunningMaps {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start_maps_on(l, keys, config, ws_url, trail_db).await
}

/// A token of `aud` for `sub` that expires `ttl` seconds from now (negative: expired).
pub fn token_for(aud: courier_auth::Audience, sub: &str, ttl: i64) -> String {
    let now = courier_wire::clock::unix_now() as i64;
    let iat = (now - 3600).max(0) as u64;
    let exp = (now + ttl).max(0) as u64;
    let claims = courier_auth::Claims {
        aud,
        sub: sub.into(),
        order: None,
        iat,
        exp,
    };
    sign(&claims)
}

/// GET with extra request headers (HTTP/1.1, one request per connection).
pub async fn http_get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpReply {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("http timeout")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    HttpReply {
        status: head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        head: head.to_string(),
        body: body.to_string(),
    }
}
