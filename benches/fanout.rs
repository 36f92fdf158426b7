//! Fanout benchmark: ONE gateway process (`courier-pipeline fanout`, a child process, release
//! build) holding as many viewers as it can, while 1,000 watched orders receive 10,000 points/s
//! from "phones" through the whole live path (phone -> broker -> ingest (another child) ->
//! Redis -> broker `track/<order>` -> gateway -> WebSocket viewer). Prints figures; asserts
//! nothing about speed.
//!
//! `cargo bench --bench fanout` (or `./dev bench fanout`). Settings (environment):
//! FANOUT_BENCH_VIEWERS (20000: capped by the open-file limit of one process),
//! FANOUT_BENCH_RATE (10000 points/s), FANOUT_BENCH_ORDERS (1000), FANOUT_BENCH_SECONDS (10).

#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use bytes::BytesMut;
use courier_auth::Claims;
use courier_wire::{loc_topic, Keys};
use futures_util::{SinkExt, StreamExt};
use rumqttc::mqttbytes::v4;
use rumqttc::{AsyncClient, QoS};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Kills the child processes whatever happens.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Default)]
struct Delays {
    /// Microseconds, phone publish to viewer receive.
    samples: Mutex<Vec<u32>>,
}

/// A minimal viewer: WebSocket + CONNECT + SUBSCRIBE in one frame, then reads forever,
/// recording the delay of each point when `delays` is given.
async fn viewer(
    ws: std::net::SocketAddr,
    token: String,
    order: String,
    delays: Option<Arc<Delays>>,
) -> Result<(), String> {
    let stream = tokio::net::TcpStream::connect(ws)
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://{ws}/mqtt"),
    )
    .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
    let cfg = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let (mut c, _) = tokio_tungstenite::client_async_with_config(req, stream, Some(cfg))
        .await
        .map_err(|e| e.to_string())?;
    let mut connect = v4::Connect::new(format!("bench-{order}"));
    connect.keep_alive = 0;
    connect.set_login("customer", token);
    let mut b = BytesMut::new();
    v4::Packet::Connect(connect).write(&mut b, 1 << 16).unwrap();
    let mut sub = v4::Subscribe::new(courier_wire::track_topic(&order), QoS::AtMostOnce);
    sub.pkid = 1;
    v4::Packet::Subscribe(sub).write(&mut b, 1 << 16).unwrap();
    c.send(Message::Binary(b.freeze()))
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = BytesMut::new();
    let mut acked = 0;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let mut ready_tx = Some(ready_tx);
    let reader = async move {
        while let Some(Ok(m)) = c.next().await {
            let Message::Binary(data) = m else { continue };
            buf.extend_from_slice(&data);
            while let Ok(p) = v4::Packet::read(&mut buf, 1 << 16) {
                match p {
                    v4::Packet::ConnAck(a) if a.code != v4::ConnectReturnCode::Success => return,
                    v4::Packet::ConnAck(_) => acked += 1,
                    v4::Packet::SubAck(_) => {
                        acked += 1;
                        if let Some(t) = ready_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    v4::Packet::Publish(p) => {
                        if let Some(d) = &delays {
                            let now = courier_wire::clock::unix_now();
                            let v: serde_json::Value =
                                serde_json::from_slice(&p.payload).unwrap_or_default();
                            if let Some(ts) = v["ts"].as_f64() {
                                d.samples
                                    .lock()
                                    .unwrap()
                                    .push(((now - ts) * 1e6).max(0.0) as u32);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let _ = acked;
    };
    tokio::spawn(reader);
    tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .map_err(|_| "no SUBACK".to_string())?
        .map_err(|_| "closed before SUBACK".to_string())?;
    Ok(())
}

/// Opens `n` viewers of `orders` (round robin), `parallel` handshakes at a time.
async fn open_viewers(
    ws: std::net::SocketAddr,
    orders: &[String],
    n: usize,
    delays: Option<Arc<Delays>>,
) -> usize {
    let exp = courier_wire::clock::unix_now() as u64 + 3600;
    let jobs = (0..n).map(|i| {
        let order = orders[i % orders.len()].clone();
        let token = sign(&Claims::viewer("customer", &order, exp - 3600, 3600));
        viewer(ws, token, order, delays.clone())
    });
    let results: Vec<_> = futures_util::stream::iter(jobs)
        .buffer_unordered(200)
        .collect()
        .await;
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if let Some(e) = failed.first() {
        eprintln!("bench: {} of {n} viewers failed, first: {e}", failed.len());
    }
    n - failed.len()
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

async fn run() {
    let nofile = courier_wire::limits::raise_nofile(0);
    let goal = env_or("FANOUT_BENCH_VIEWERS", 20_000) as usize;
    let rate = env_or("FANOUT_BENCH_RATE", 10_000);
    let n_orders = env_or("FANOUT_BENCH_ORDERS", 1_000) as usize;
    let seconds = env_or("FANOUT_BENCH_SECONDS", 10);
    // The gateway needs a descriptor per viewer plus a few; this process one per viewer too.
    let viewers_total = goal.min(nofile.saturating_sub(150) as usize);
    let held = viewers_total.saturating_sub(n_orders);

    let broker = start_broker(BrokerKind::Mosquitto);
    let prefix = prefix();
    let keys = Keys::with_prefix(&prefix);
    let dir = std::env::temp_dir().join(format!("fanout-bench-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("bench.toml");
    std::fs::write(&conf, format!("[redis]\nkey_prefix = \"{prefix}\"\n[fanout]\nmax_viewers = 100000\nqueue_capacity = 64\n# Many viewers share each order's token here.\nmax_sessions_per_token = 100000\n")).unwrap();
    let bin = env!("CARGO_BIN_EXE_courier-pipeline");
    // Each process binds port 0 and reports what it bound, once it listens.
    let spawn = |role: &str| {
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&conf)
            .arg(role)
            .env(
                "MQTT_URL",
                format!("mqtt://{}:{}", broker.endpoint.host, broker.endpoint.port),
            )
            .env("REDIS_URL", &services().redis_url)
            .env("DATABASE_URL", &services().database_url)
            .env("HTTP_LISTEN", "127.0.0.1:0")
            .env("WS_LISTEN", "127.0.0.1:0")
            .env("METRICS_LISTEN", "127.0.0.1:0")
            .env("AUTH_KEY_DIR", test_key_dir())
            .env("SERVICE_KEY", TEST_SERVICE_KEY)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let report = ListenReport::on(&mut cmd);
        let mut child = cmd.spawn().expect("starting courier-pipeline");
        let bound = report.wait(&mut child, role);
        (child, bound)
    };
    let (gateway, gw) = spawn("fanout");
    let gw_pid = gateway.id();
    let (ingest, ingest_bound) = spawn("ingest");
    let _children = Children(vec![gateway, ingest]);
    let (ws, gw_metrics, ingest_metrics) =
        (gw.get("ws"), gw.get("metrics"), ingest_bound.get("metrics"));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Orders o0.. carry couriers c0..; held viewers watch orders h0.. that get no points.
    let mut r = redis().await;
    let orders: Vec<String> = (0..n_orders).map(|i| format!("o{i}")).collect();
    let idle: Vec<String> = (0..n_orders).map(|i| format!("h{i}")).collect();
    for (i, (o, h)) in orders.iter().zip(&idle).enumerate() {
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(&keys.order_courier)
            .arg(o)
            .arg(format!("c{i}"))
            .cmd("HSET")
            .arg(&keys.order)
            .arg(format!("c{i}"))
            .arg(o)
            .cmd("HSET")
            .arg(&keys.order_courier)
            .arg(h)
            .arg(format!("idle{i}"))
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let rss_start = common::status_kib(gw_pid, "VmRSS:");

    // 1. Viewers held.
    let t0 = Instant::now();
    let got_held = open_viewers(ws, &idle, held, None).await;
    let delays = Arc::new(Delays::default());
    let got_live = open_viewers(ws, &orders, n_orders, Some(delays.clone())).await;
    let connect_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_held = common::status_kib(gw_pid, "VmRSS:");
    let viewers = got_held + got_live;
    println!(
        "fanout viewers held: {viewers} of {goal} asked (open-file limit {nofile} per process) in {connect_secs:.1}s; gateway RSS {:.1} MiB -> {:.1} MiB, {:.1} KiB per viewer",
        rss_start as f64 / 1024.0,
        rss_held as f64 / 1024.0,
        (rss_held.saturating_sub(rss_start)) as f64 / viewers.max(1) as f64
    );

    // 2. Phone-to-viewer delay at `rate` points/s over the watched orders, while the held
    //    viewers stay connected.
    let conns = 4usize;
    let mut phones: Vec<AsyncClient> = Vec::new();
    for _ in 0..conns {
        let (c, _h) = client(&broker.endpoint, None).await;
        phones.push(c);
    }
    let seq = Arc::new(AtomicU64::new(1));
    // `direct`: publish `track/<order>` as ingest would, to time the gateway hop alone.
    let publish_for = |secs: u64, direct: bool| {
        let phones = phones.clone();
        let seq = seq.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let per_ms = rate as f64 / 1000.0;
            let (start, mut sent, mut next_courier) = (Instant::now(), 0u64, 0usize);
            while start.elapsed() < Duration::from_secs(secs) {
                tick.tick().await;
                let due = (start.elapsed().as_secs_f64() * 1000.0 * per_ms) as u64;
                while sent < due {
                    let c = next_courier % n_orders;
                    next_courier += 1;
                    let s = seq.fetch_add(1, Relaxed);
                    let id = format!("c{c}");
                    let (lat, lon) = (24.6 + c as f64 * 1e-4, 46.6 + (s % 1000) as f64 * 1e-5);
                    let now = courier_wire::clock::unix_now();
                    let (topic, payload) = if direct {
                        (
                            courier_wire::track_topic(&format!("o{c}")),
                            courier_wire::encode_track(lat, lon, now),
                        )
                    } else {
                        (loc_topic(&id), point(&id, lat, lon, now, s))
                    };
                    if phones[c % conns]
                        .try_publish(topic, QoS::AtMostOnce, false, payload)
                        .is_ok()
                    {
                        sent += 1;
                    }
                }
            }
            sent
        }
    };
    publish_for(2, false).await; // warm-up
    for (label, direct) in [
        ("phone->viewer (whole live path)", false),
        ("track->viewer (broker + gateway only)", true),
    ] {
        tokio::time::sleep(Duration::from_millis(500)).await;
        delays.samples.lock().unwrap().clear();
        let cpu0 = common::cpu_seconds(gw_pid);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let sent = publish_for(seconds, direct).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cpu = common::cpu_seconds(gw_pid) - cpu0;
        let mut s = std::mem::take(&mut *delays.samples.lock().unwrap());
        s.sort_unstable();
        println!(
            "fanout delay {label} at {rate} points/s over {n_orders} watched orders ({viewers} viewers connected), {seconds}s: \
             sent {sent}, received {} ({:.2}%), p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; gateway CPU {:.0}% of one core, RSS {:.1} MiB; load average before {}",
            s.len(),
            100.0 * s.len() as f64 / sent.max(1) as f64,
            percentile(&s, 0.5),
            percentile(&s, 0.9),
            percentile(&s, 0.99),
            percentile(&s, 1.0),
            100.0 * cpu / seconds as f64,
            common::status_kib(gw_pid, "VmRSS:") as f64 / 1024.0,
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        );
    }
    for (who, addr) in [("ingest", ingest_metrics), ("gateway", gw_metrics)] {
        println!("  {who}: {}", scrape(addr).await);
    }
    cleanup_all(&keys).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The counters that tell where points went, from a child's /metrics.
async fn scrape(addr: std::net::SocketAddr) -> String {
    let client = courier_wire::http_client::HttpClient::new(Duration::from_secs(5), 64 << 20);
    let Ok(answer) = client.get(&format!("http://{addr}/metrics"), &[]).await else {
        return "no /metrics".into();
    };
    let out = answer.text();
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            [
                "ingest_points_total",
                "ingest_queue_dropped_total",
                "ingest_tracks_",
                "fanout_tracks_received",
                "fanout_points_",
                "broker_cursor",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    // `cargo test --all-targets` (./dev test) runs this binary too, without `--bench`: the
    // benchmark runs only under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("fanout benchmark: run it with `cargo bench --bench fanout`");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}
