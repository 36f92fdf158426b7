//! The MQTT edge at scale, as separate processes on this box: several `courier-pipeline edge`
//! processes sharing one port (SO_REUSEPORT) on several loopback addresses, several
//! `courier-pipeline simulate` processes (one MQTT connection per courier, each with its Last
//! Will, one point every `EDGE_BENCH_INTERVAL` s), the embedded bus (`courier-pipeline broker`)
//! and one ingest worker behind it. A process here may hold 20,000 open files, so 60,000 phones
//! need at least four of each.
//!
//! Prints: phones held at once and how long they took to connect; memory per phone at the edges
//! (RSS over the edges' RSS before the phones came); the edges' CPU per point; the reconnect rate
//! after every edge is killed and restarted at once; the ledger (points sent by the phones vs
//! judged by ingest); then memory per connection over TLS and WebSocket (a smaller count of
//! connections opened by this benchmark itself against one more edge process).
//!
//!   cargo bench --bench edge
//!   EDGE_BENCH_PHONES=20000 EDGE_BENCH_EDGES=2 EDGE_BENCH_SIMS=2 cargo bench --bench edge
//!
//! Settings (environment): EDGE_BENCH_PHONES (60000), EDGE_BENCH_EDGES (4), EDGE_BENCH_SIMS (4),
//! EDGE_BENCH_ADDRS (loopback addresses 127.0.0.1.., 3), EDGE_BENCH_INTERVAL (10 s; 0.1 for the
//! CPU per point under load: `EDGE_BENCH_PHONES=6000 EDGE_BENCH_INTERVAL=0.1`),
//! EDGE_BENCH_EDGE_BIN (run the edge processes from another build, for before/after),
//! EDGE_BENCH_WINDOW (steady window, 30 s), EDGE_BENCH_TLS_WS (connections for the TLS and
//! WebSocket figure, 3000 each; 0 skips). `cargo test` runs nothing here.

mod common;
#[path = "../tests/it/support/mod.rs"]
mod support;

use common::{free_addr, metric, scrape, spawn, wait_port, ListenReport, Proc};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{sign, test_key_dir};

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
        .unwrap_or(default)
}

struct EdgeProc {
    proc: Proc,
    metrics: SocketAddr,
}

fn start_edge(
    i: usize,
    listen: &str,
    bus: SocketAddr,
    dir: &Path,
    extra: &[(&str, String)],
) -> EdgeProc {
    // Chosen here, not read from LISTEN_REPORT: EDGE_BENCH_EDGE_BIN may name a build older
    // than the report.
    let metrics = free_addr();
    // EDGE_BENCH_EDGE_BIN: the edge processes from another build (before/after in one run).
    let bin = std::env::var("EDGE_BENCH_EDGE_BIN").unwrap_or_else(|_| BIN.to_string());
    let mut c = Command::new(bin);
    // The edge reads no private key: it checks device tokens with courier.pub and logs in to
    // the bus with a bus token it is given.
    let now = courier_wire::clock::unix_now() as u64;
    c.arg("edge")
        .env("AUTH_KEY_DIR", test_key_dir())
        .env(
            "MQTT_TOKEN",
            sign(&courier_auth::Claims::bus("edge", now, 86_400)),
        )
        .env("MQTT_URL", format!("mqtt://{bus}"))
        .env("EDGE_LISTEN", listen)
        .env("METRICS_LISTEN", metrics.to_string());
    for (k, v) in extra {
        c.env(k, v);
    }
    let proc = spawn("edge", &mut c, &dir.join(format!("edge-{i}.log")));
    wait_port(metrics, "edge metrics");
    EdgeProc { proc, metrics }
}

fn sum_metric(edges: &[EdgeProc], name: &str, label: Option<&str>) -> f64 {
    edges
        .iter()
        .filter_map(|e| scrape(e.metrics).and_then(|t| metric(&t, name, label)))
        .sum()
}

fn rss_kib(pids: impl Iterator<Item = u32>) -> u64 {
    pids.map(|p| common::status_kib(p, "VmRSS:")).sum()
}

/// Waits until the edges hold `want` phones; returns the seconds it took, or `None` on timeout.
fn wait_connected(edges: &[EdgeProc], want: f64, limit: Duration) -> Option<f64> {
    let t0 = Instant::now();
    let mut last = -1.0;
    while t0.elapsed() < limit {
        let n = sum_metric(edges, "edge_connections", None);
        if n >= want {
            return Some(t0.elapsed().as_secs_f64());
        }
        if n != last {
            eprintln!(
                "  {:>5.1}s {n:.0} of {want:.0} phones connected",
                t0.elapsed().as_secs_f64()
            );
            last = n;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    None
}

/// Points ingest judged (accepted, stale or invalid) so far.
fn judged_total(ingest: SocketAddr) -> f64 {
    let it = scrape(ingest).unwrap_or_default();
    ["accepted", "stale", "invalid"]
        .iter()
        .filter_map(|r| metric(&it, "ingest_points_total", Some(&format!("result=\"{r}\""))))
        .sum()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let phones = env_num("EDGE_BENCH_PHONES", 60_000);
    let n_edges = env_num("EDGE_BENCH_EDGES", 4) as usize;
    let n_sims = env_num("EDGE_BENCH_SIMS", 4);
    let n_addrs = env_num("EDGE_BENCH_ADDRS", 3);
    let interval: f64 = std::env::var("EDGE_BENCH_INTERVAL")
        .ok()
        .map(|v| v.parse().expect("EDGE_BENCH_INTERVAL: seconds"))
        .unwrap_or(10.0);
    // Waits of "one interval" below, at least a second.
    let settle = Duration::from_secs_f64(interval.max(1.0));
    let window = env_num("EDGE_BENCH_WINDOW", 30);
    let tls_ws = env_num("EDGE_BENCH_TLS_WS", 3000);
    let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL (./dev bench sets it)");
    let dir = std::env::temp_dir().join(format!("edge-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = format!("eb{:08x}:", rand::random::<u32>());
    println!(
        "edge: {phones} phones (one connection each, Will set, a point every {interval} s) over {n_sims} simulator processes, {n_edges} edge processes on one port x {n_addrs} loopback addresses, bus + 1 ingest; logs in {}",
        dir.display()
    );

    // The bus and one ingest worker. The bus is rumqttd, which cannot report a port 0.
    let bus = free_addr();
    let _bus = spawn(
        "bus",
        Command::new(BIN)
            .arg("broker")
            .env("AUTH_KEY_DIR", test_key_dir())
            .env("MQTT_LISTEN", bus.to_string())
            .env("METRICS_LISTEN", "off"),
        &dir.join("bus.log"),
    );
    wait_port(bus, "bus");
    let conf = dir.join("ingest.toml");
    std::fs::write(&conf, format!("[redis]\nkey_prefix = \"{prefix}\"\n")).unwrap();
    let mut c = Command::new(BIN);
    c.args(["--config", conf.to_str().unwrap(), "ingest"])
        .env("AUTH_KEY_DIR", test_key_dir())
        .env("MQTT_URL", format!("mqtt://{bus}"))
        .env("REDIS_URL", &redis_url)
        .env("METRICS_LISTEN", "127.0.0.1:0");
    let report = ListenReport::on(&mut c);
    let mut ingest = spawn("ingest", &mut c, &dir.join("ingest.log"));
    let ingest_metrics = report.wait(&mut ingest.child, "ingest").get("metrics");

    // Edges: one port, several addresses, several processes (SO_REUSEPORT): the port must be
    // known before the first starts.
    let port = free_addr().port();
    let addrs: Vec<String> = (1..=n_addrs)
        .map(|i| format!("127.0.0.{i}:{port}"))
        .collect();
    let listen = addrs.join(",");
    let mut edges: Vec<EdgeProc> = (0..n_edges)
        .map(|i| start_edge(i, &listen, bus, &dir, &[]))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let base_rss = rss_kib(edges.iter().map(|e| e.proc.pid()));

    // Phones.
    let per_sim = phones / n_sims;
    let start_sims = |round: &str| -> Vec<Proc> {
        (0..n_sims)
            .map(|m| {
                let mut c = Command::new(BIN);
                c.args(["simulate", "--couriers", &per_sim.to_string()])
                    .args(["--interval", &interval.to_string(), "--seconds", "3600"])
                    .args(["--id-prefix", &format!("{round}{m}-")])
                    .args([
                        "--report",
                        dir.join(format!("{round}-sim-{m}.json")).to_str().unwrap(),
                    ])
                    .env("AUTH_KEY_DIR", test_key_dir())
                    .env("MQTT_URL", format!("mqtt://{bus}"))
                    .env("EDGE_LISTEN", &addrs[0])
                    .env("REDIS_URL", &redis_url)
                    .env("METRICS_LISTEN", "off");
                for a in &addrs[1..] {
                    c.args(["--also-mqtt-url", &format!("mqtt://{a}")]);
                }
                spawn(
                    "simulate",
                    &mut c,
                    &dir.join(format!("{round}-sim-{m}.log")),
                )
            })
            .collect()
    };
    // Stops the phones (their reports are written on the way out) and compares what they sent
    // with what ingest judged since `judged_before`.
    let ledger = |sims: Vec<Proc>, round: &str, judged_before: f64| -> (u64, f64) {
        drop(sims);
        std::thread::sleep(Duration::from_secs(2));
        let (mut sent, mut client_dropped) = (0u64, 0u64);
        for m in 0..n_sims {
            let text = std::fs::read_to_string(dir.join(format!("{round}-sim-{m}.json")))
                .unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            sent += v["sent"].as_u64().unwrap_or(0);
            client_dropped += v["client_dropped"].as_u64().unwrap_or(0);
        }
        let judged = judged_total(ingest_metrics) - judged_before;
        println!(
            "  ledger (round {round}): phones sent {sent} points ({client_dropped} dropped in the phones' own queues); ingest judged {judged:.0}; lost {:.0} ({:.3}%)",
            sent as f64 - judged,
            (sent as f64 - judged) * 100.0 / (sent as f64).max(1.0)
        );
        (sent, judged)
    };
    let sims = start_sims("a");
    let want = (per_sim * n_sims) as f64;
    let connect = wait_connected(&edges, want, Duration::from_secs(300));
    let held = sum_metric(&edges, "edge_connections", None);
    match connect {
        Some(s) => println!("phones held at once: {held:.0}; all connected {s:.1} s after the simulators started ({:.0} phones/s)", want / s),
        None => println!("phones held at once: {held:.0} of {want:.0} (NOT all within 300 s)"),
    }

    // Steady state.
    std::thread::sleep(settle + Duration::from_secs(2));
    let pids = || edges.iter().map(|e| e.proc.pid()).collect::<Vec<_>>();
    let cpu0: f64 = pids().into_iter().map(common::cpu_seconds).sum();
    let fwd0 = sum_metric(&edges, "edge_messages_total", Some("result=\"forwarded\""));
    std::thread::sleep(Duration::from_secs(window));
    let cpu1: f64 = pids().into_iter().map(common::cpu_seconds).sum();
    let fwd1 = sum_metric(&edges, "edge_messages_total", Some("result=\"forwarded\""));
    let rss = rss_kib(pids().into_iter());
    let per_edge: Vec<String> = edges
        .iter()
        .map(|e| {
            format!(
                "{:.0} phones {} MiB",
                scrape(e.metrics)
                    .and_then(|t| metric(&t, "edge_connections", None))
                    .unwrap_or(0.0),
                common::status_kib(e.proc.pid(), "VmRSS:") / 1024
            )
        })
        .collect();
    let sim_rss = rss_kib(sims.iter().map(|s| s.pid()));
    println!(
        "edge memory per phone (plain TCP): {:.2} KiB ({} MiB over {} MiB before the phones, {} edges: {})",
        (rss.saturating_sub(base_rss)) as f64 / held.max(1.0),
        rss / 1024,
        base_rss / 1024,
        n_edges,
        per_edge.join(", ")
    );
    println!(
        "edge CPU per point: {:.2} µs ({:.0} points/s forwarded over {window} s, {:.2} cores); simulators' RSS {:.1} KiB per phone",
        (cpu1 - cpu0) * 1e6 / (fwd1 - fwd0).max(1.0),
        (fwd1 - fwd0) / window as f64,
        (cpu1 - cpu0) / window as f64,
        sim_rss as f64 / held.max(1.0)
    );
    let refused = sum_metric(&edges, "edge_refusals_total", None);
    let dropped = sum_metric(&edges, "edge_messages_total", Some("result=\"queue_full\""))
        + sum_metric(
            &edges,
            "edge_messages_total",
            Some("result=\"rate_limited\""),
        );
    println!("  edge refusals {refused:.0}, edge drops (queue full, rate limited) {dropped:.0}");
    ledger(sims, "a", 0.0);

    // A second round: every edge killed at once and started again while the phones are up.
    let judged_before = judged_total(ingest_metrics);
    let sims = start_sims("b");
    if wait_connected(&edges, want, Duration::from_secs(300)).is_none() {
        println!("  (second round: not every phone connected)");
    }
    std::thread::sleep(settle);
    for e in &mut edges {
        let _ = e.proc.child.kill();
        let _ = e.proc.child.wait();
    }
    let t_kill = Instant::now();
    edges = (0..n_edges)
        .map(|i| start_edge(i + 100, &listen, bus, &dir, &[]))
        .collect();
    match wait_connected(&edges, want, Duration::from_secs(300)) {
        Some(_) => {
            let s = t_kill.elapsed().as_secs_f64();
            println!(
                "after killing every edge process at once: {want:.0} phones back {s:.1} s after the kill ({:.0} phones/s; phones retry with backoff 0.25-5 s)",
                want / s
            )
        }
        None => println!("after killing every edge: NOT all phones back within 300 s"),
    }
    std::thread::sleep(settle + Duration::from_secs(2));
    println!(
        "  (round b: killed edges lose what they held and what phones wrote to dying sockets)"
    );
    ledger(sims, "b", judged_before);
    drop(edges);

    if tls_ws > 0 {
        transports(tls_ws as usize, bus, &dir);
    }
    let _ = Command::new("redis-cli")
        .args([
            "-u",
            &redis_url,
            "--scan",
            "--pattern",
            &format!("{prefix}*"),
        ])
        .output()
        .map(|o| {
            for k in String::from_utf8_lossy(&o.stdout).lines() {
                let _ = Command::new("redis-cli")
                    .args(["-u", &redis_url, "DEL", k])
                    .output();
            }
        });
}

/// Memory per connection over TLS and over WebSocket at one more edge process: `n` logged-in
/// connections of each, held by rumqttc clients in this process.
fn transports(n: usize, bus: SocketAddr, dir: &Path) {
    courier_wire::mqtt::install_crypto_provider();
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (ca_file, cert, key) = support::throwaway_tls(&certs);
    // One fresh edge process per transport: memory freed by one figure's connections would be
    // reused by the next and hide its cost.
    let tls_edge = |i: usize, tls: SocketAddr| {
        start_edge(
            i,
            "off",
            bus,
            dir,
            &[
                ("EDGE_TLS_LISTEN", tls.to_string()),
                ("EDGE_TLS_CERT", cert.display().to_string()),
                ("EDGE_TLS_KEY", key.display().to_string()),
            ],
        )
    };
    // Chosen here: the edges may come from an older build (EDGE_BENCH_EDGE_BIN).
    let (tls, ws) = (free_addr(), free_addr());
    let ca = std::fs::read(ca_file).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let measure = |what: &str, edge: EdgeProc, make: &dyn Fn(usize) -> rumqttc::MqttOptions| {
        let before = common::status_kib(edge.proc.pid(), "VmRSS:");
        let held = rt.block_on(async {
            let mut clients = Vec::with_capacity(n);
            for i in 0..n {
                let (c, mut el) = rumqttc::AsyncClient::new(make(i), 4);
                tokio::spawn(async move { while el.poll().await.is_ok() {} });
                clients.push(c);
                if i % 200 == 199 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(60) {
                let up = scrape(edge.metrics)
                    .and_then(|t| metric(&t, "edge_connections", None))
                    .unwrap_or(0.0);
                if up >= n as f64 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            let held = scrape(edge.metrics)
                .and_then(|t| metric(&t, "edge_connections", None))
                .unwrap_or(0.0);
            let after = common::status_kib(edge.proc.pid(), "VmRSS:");
            for c in &clients {
                let _ = c.try_disconnect();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            (held, after)
        });
        println!(
            "edge memory per connection over {what}: {:.1} KiB ({:.0} connections held)",
            held.1.saturating_sub(before) as f64 / held.0.max(1.0),
            held.0
        );
    };
    let now = courier_wire::clock::unix_now() as u64;
    let login = |o: &mut rumqttc::MqttOptions, id: &str| {
        o.set_credentials(id, sign(&courier_auth::Claims::courier(id, now, 3600)));
        o.set_keep_alive(Duration::from_secs(60));
    };
    measure("TLS", tls_edge(998, tls), &|i| {
        let id = format!("tls{i}");
        let mut o = rumqttc::MqttOptions::new(id.clone(), "localhost", tls.port());
        o.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Simple {
                ca: ca.clone(),
                alpn: None,
                client_auth: None,
            },
        ));
        login(&mut o, &id);
        o
    });
    let ws_edge = start_edge(999, "off", bus, dir, &[("EDGE_WS_LISTEN", ws.to_string())]);
    measure("WebSocket", ws_edge, &|i| {
        let id = format!("ws{i}");
        let mut o = rumqttc::MqttOptions::new(
            id.clone(),
            format!("ws://127.0.0.1:{}/mqtt", ws.port()),
            ws.port(),
        );
        o.set_transport(rumqttc::Transport::Ws);
        login(&mut o, &id);
        o
    });
}
