//! A real browser for the maps' tests and benchmark: headless Chromium (Debian's `chromium`,
//! installed by `./dev`) driven over the DevTools protocol (CDP: JSON over one WebSocket) with
//! the tokio-tungstenite client the suite already has, so no CDP crate and no npm at test time.
//! Only what the tests use: open a page, evaluate JavaScript, read the network log, screenshot.

use super::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

pub fn chromium_bin() -> PathBuf {
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("chromium not installed: run ./dev test (it installs it)");
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>>;
/// Every event the browser sent: method, params, session.
type Events = Arc<Mutex<Vec<(String, Value, Option<String>)>>>;

pub struct Browser {
    child: Child,
    dir: PathBuf,
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    /// Every event the browser sent (method, params, session), in order.
    events: Events,
    next: AtomicU64,
}

/// One tab.
pub struct Tab<'a> {
    browser: &'a Browser,
    session: String,
}

impl Browser {
    /// Starts Chromium with a fresh profile, the flags this closed network needs (no
    /// background connections, no QUIC, no component updates), and DevTools on a free port.
    pub async fn start() -> Browser {
        let dir =
            std::env::temp_dir().join(format!("courier-chromium-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(chromium_bin())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--mute-audio",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1000,700",
            ])
            .arg(format!("--user-data-dir={}", dir.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting chromium");
        // It prints its DevTools address on stderr; the rest of stderr is drained so it never
        // blocks on a full pipe.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(url.trim().to_string());
                    }
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium printed no DevTools address within 30 s");
        let host = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .expect("a ws:// DevTools address")
            .to_string();
        let tcp = tokio::net::TcpStream::connect(&host)
            .await
            .expect("connecting to chromium's DevTools");
        let (ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
            .await
            .expect("the DevTools WebSocket handshake");
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let pending: Pending = Arc::default();
        let events: Events = Arc::default();
        let (p, e) = (pending.clone(), events.clone());
        tokio::spawn(async move {
            while let Some(Ok(m)) = stream.next().await {
                let Message::Text(text) = m else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if let Some(id) = v["id"].as_u64() {
                    if let Some(tx) = p.lock().unwrap().remove(&id) {
                        let r = match v.get("error") {
                            Some(err) => Err(err.clone()),
                            None => Ok(v["result"].clone()),
                        };
                        let _ = tx.send(r);
                    }
                } else if let Some(method) = v["method"].as_str() {
                    let session = v["sessionId"].as_str().map(str::to_string);
                    e.lock()
                        .unwrap()
                        .push((method.to_string(), v["params"].clone(), session));
                }
            }
        });
        Browser {
            child,
            dir,
            out,
            pending,
            events,
            next: AtomicU64::new(1),
        }
    }

    async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        let id = self.next.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.out.send(Message::text(msg.to_string())).unwrap();
        tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap_or_else(|_| panic!("chromium did not answer {method} within 30 s"))
            .expect("chromium connection lost")
    }

    /// A new tab of `width` x `height` CSS pixels, with its network log on.
    pub async fn tab(&self, width: u32, height: u32) -> Tab<'_> {
        let t = self
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await
            .unwrap();
        let target = t["targetId"].as_str().unwrap().to_string();
        let a = self
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await
            .unwrap();
        let tab = Tab {
            browser: self,
            session: a["sessionId"].as_str().unwrap().to_string(),
        };
        for m in ["Page.enable", "Runtime.enable", "Network.enable"] {
            tab.call(m, json!({})).await;
        }
        tab.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        tab
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its helper processes may still write to the profile for a moment after it is gone.
        for _ in 0..20 {
            if std::fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A response the tab received: URL and HTTP status (101 for a WebSocket upgrade).
#[derive(Debug, Clone)]
pub struct NetResponse {
    pub url: String,
    pub status: u64,
}

impl Tab<'_> {
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.browser
            .call(Some(&self.session), method, params)
            .await
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    /// Opens `url` and waits until its document and deferred scripts have run.
    pub async fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        assert!(
            self.wait_for(
                "document.readyState === 'complete'",
                Duration::from_secs(20)
            )
            .await,
            "{url} did not load"
        );
    }

    /// The value of `expression` (promises awaited), as JSON.
    pub async fn eval(&self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression} threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expression` every 100 ms until it is true, at most `within`.
    pub async fn wait_for(&self, expression: &str, within: Duration) -> bool {
        let end = Instant::now() + within;
        loop {
            let v = self
                .browser
                .call(
                    Some(&self.session),
                    "Runtime.evaluate",
                    json!({ "expression": expression, "returnByValue": true }),
                )
                .await;
            if matches!(v, Ok(ref r) if r["result"]["value"] == json!(true)) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every HTTP response this tab received so far.
    pub fn responses(&self) -> Vec<NetResponse> {
        self.browser
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _, s)| {
                m == "Network.responseReceived" && s.as_deref() == Some(&self.session)
            })
            .map(|(_, p, _)| NetResponse {
                url: p["response"]["url"].as_str().unwrap_or("").to_string(),
                status: p["response"]["status"].as_u64().unwrap_or(0),
            })
            .collect()
    }

    /// The frames this tab received over WebSockets (their payloads, as text).
    pub fn ws_frames_received(&self) -> usize {
        self.browser
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _, s)| {
                m == "Network.webSocketFrameReceived" && s.as_deref() == Some(&self.session)
            })
            .count()
    }

    /// A PNG of the tab as it is now.
    pub async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let r = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}
