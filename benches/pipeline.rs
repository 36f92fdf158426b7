//! The whole pipeline under stepping load: `courier-pipeline run` (embedded broker), and again
//! `courier-pipeline ingest` against Mosquitto, fed by `courier-pipeline simulate` at rising
//! rates. Prints a table (and writes it to a file): rate asked, sent, received by ingest,
//! accepted, loss, history rows, phone-to-viewer delay, CPU per point (each process, and Redis and
//! PostgreSQL) and RSS per process.
//!
//! The delay is measured the customer's way when the `run` process has fanout (the embedded
//! mode with AUTH_KEY_DIR and SERVICE_KEY set, as ./dev sets them): orders assigned through its
//! orders API, watchers on its viewer gateway over WebSocket. Otherwise (Mosquitto mode, no
//! keys) the watchers subscribe on the broker. Each row says which.
//!
//!   ./dev bench pipeline
//!   PIPELINE_STEP_SECONDS=5 PIPELINE_RATES=2000,8000 PIPELINE_MODES=embedded ./dev bench pipeline
//!
//! Settings (environment): PIPELINE_RATES (msg/s, default 2000,...,128000), PIPELINE_STEP_SECONDS
//! (default 30), PIPELINE_MODES (embedded,embedded-single,mosquitto: `embedded-single` is
//! `run` with the single-node settings, ingest.group = history.group = ""; `edge` and
//! `edge-single` are the same with the phones through `run`'s MQTT edge, one connection per
//! courier, 10 points a second each, rate/10 couriers), PIPELINE_ORDERS (watched orders, 20),
//! PIPELINE_WORKERS (ingest workers, 2), PIPELINE_INGEST_EXTRA (more `[ingest]` lines, `;` between
//! them, e.g. `seen_every = "0s"`), PIPELINE_TABLE (output file, default
//! <target dir>/pipeline-bench.md). Figures come only from the processes' /metrics and the
//! simulator's --report JSON. Everything started is stopped by PID; keys live under a fresh
//! prefix and are deleted, history rows in a fresh schema per mode, dropped at its end. `cargo test` runs nothing here.

mod common;

use common::{free_addr, metric, scrape, spawn, wait_port, ListenReport, Proc};

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

struct Row {
    mode: String,
    rate: u64,
    sent: u64,
    sent_rate: f64,
    received: f64,
    accepted: f64,
    lost_pct: f64,
    cursor_jumps: Option<f64>,
    queue_dropped: f64,
    reconnects: f64,
    history: Option<f64>,
    delay: String,
    /// `gateway` or `broker`.
    viewer_path: &'static str,
    cpu: String,
    rss: String,
}

fn header() -> String {
    "| broker | rate asked | sent (msg/s) | received by ingest | accepted | lost (sent - accepted) | broker loss signal | ingest queue drops | ingest reconnects | history rows | delay p50 / p99 (viewer path) | CPU µs per point | RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|".to_string()
}

impl Row {
    fn line(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0}"));
        format!(
            "| {} | {} | {} ({:.0}) | {:.0} | {:.0} | {:.2}% | {} | {:.0} | {:.0} | {} | {} ({}) | {} | {} |",
            self.mode,
            self.rate,
            self.sent,
            self.sent_rate,
            self.received,
            self.accepted,
            self.lost_pct,
            opt(self.cursor_jumps),
            self.queue_dropped,
            self.reconnects,
            opt(self.history),
            self.delay,
            self.viewer_path,
            self.cpu,
            self.rss
        )
    }
}

fn mosquitto_bin() -> PathBuf {
    [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .expect("mosquitto not installed (./dev installs it)")
}

/// Runs one statement with `psql` (installed with PostgreSQL by `./dev`).
fn psql(url: &str, sql: &str) {
    let ok = Command::new("psql")
        .args([url, "-qc", sql])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "psql: {sql} failed");
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rates: Vec<u64> = env_or("PIPELINE_RATES", "2000,4000,8000,16000,32000,64000,128000")
        .split(',')
        .map(|r| r.trim().parse().expect("PIPELINE_RATES: numbers"))
        .collect();
    let step: f64 = env_or("PIPELINE_STEP_SECONDS", "30")
        .parse()
        .expect("PIPELINE_STEP_SECONDS");
    let orders = env_or("PIPELINE_ORDERS", "20");
    let workers = env_or("PIPELINE_WORKERS", "2");
    let modes = env_or("PIPELINE_MODES", "embedded,embedded-single,mosquitto");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let table = PathBuf::from(env_or(
        "PIPELINE_TABLE",
        &format!("{target}/pipeline-bench.md"),
    ));
    let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL (./dev bench sets it)");
    let dir = std::env::temp_dir().join(format!("pipeline-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let started = Instant::now();
    let mut rows = Vec::new();
    println!("whole pipeline: steps of {step} s at {rates:?} msg/s (couriers = rate, one point a second each), {orders} watched orders (through the orders API and the viewer gateway where `run` has fanout, else on the broker), logs in {}", dir.display());
    println!("{}", header());
    let database_url = std::env::var("DATABASE_URL").expect("DATABASE_URL (./dev bench sets it)");
    for mode in modes.split(',').map(str::trim) {
        let prefix = format!("pb{:08x}:", rand::random::<u32>());
        // The history rows go to a schema of this mode's own, dropped at its end, so the day's
        // partition starts empty in every run instead of holding every earlier run's rows (22
        // million by one evening, PostgreSQL's CPU per point near doubled with them).
        let schema = prefix.trim_end_matches(':').to_string();
        psql(&database_url, &format!("CREATE SCHEMA {schema}"));
        let sep = if database_url.contains('?') { '&' } else { '?' };
        let mode_database_url = format!("{database_url}{sep}options=-csearch_path%3D{schema}");
        let config = dir.join(format!("{mode}.toml"));
        let extra = std::env::var("PIPELINE_INGEST_EXTRA")
            .unwrap_or_default()
            .replace(';', "\n");
        std::fs::write(
            &config,
            // `embedded-single`: the single-node settings (plain subscriptions, one client each).
            if mode.ends_with("-single") {
                format!("[redis]\nkey_prefix = \"{prefix}\"\n\n[ingest]\nworkers = 1\ngroup = \"\"\nstatus_group = \"\"\n{extra}\n\n[history]\ngroup = \"\"\n")
            } else {
                format!("[redis]\nkey_prefix = \"{prefix}\"\n\n[ingest]\nworkers = {workers}\n{extra}\n")
            },
        )
        .unwrap();
        // The bus (rumqttd or Mosquitto) cannot report a port 0: its port is chosen here. The
        // pipeline's own listeners are bound on port 0 and read back from its LISTEN_REPORT.
        let mqtt = free_addr();
        // `edge` modes: the phones, one connection per courier, log in at `run`'s edge.
        let phones_via_edge = mode.starts_with("edge");
        let runs_all = mode.starts_with("embedded") || phones_via_edge;
        let common = |c: &mut Command| {
            c.arg("--config")
                .arg(&config)
                .env("REDIS_URL", &redis_url)
                .env("DATABASE_URL", &mode_database_url)
                .env("METRICS_LISTEN", "127.0.0.1:0")
                .env("HTTP_LISTEN", "127.0.0.1:0")
                .env("WS_LISTEN", "127.0.0.1:0")
                .env("RUST_LOG", "warn");
            ListenReport::on(c)
        };
        let mut procs: Vec<Proc> = Vec::new();
        let report = match mode {
            "embedded" | "embedded-single" | "edge" | "edge-single" => {
                let mut c = Command::new(BIN);
                c.arg("run")
                    .env_remove("MQTT_URL")
                    .env("MQTT_LISTEN", mqtt.to_string())
                    // Embedded modes: shared simulator connections go to the bus, no edge.
                    .env(
                        "EDGE_LISTEN",
                        if phones_via_edge { "127.0.0.1:0" } else { "off" },
                    );
                let report = common(&mut c);
                procs.push(spawn("run", &mut c, &dir.join("run.log")));
                report
            }
            "mosquitto" => {
                let conf = dir.join("mosquitto.conf");
                std::fs::write(
                    &conf,
                    format!("listener {} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nlog_dest stderr\nlog_type error\nmax_queued_messages 100000\n", mqtt.port()),
                )
                .unwrap();
                let mut m = Command::new(mosquitto_bin());
                m.arg("-c").arg(&conf);
                procs.push(spawn("mosquitto", &mut m, &dir.join("mosquitto.log")));
                wait_port(mqtt, "mosquitto");
                let mut c = Command::new(BIN);
                c.arg("ingest").env("MQTT_URL", format!("mqtt://{mqtt}"));
                let report = common(&mut c);
                procs.push(spawn("ingest", &mut c, &dir.join("ingest.log")));
                report
            }
            other => panic!(
                "PIPELINE_MODES: unknown mode {other:?} (embedded, embedded-single, edge, edge-single, mosquitto)"
            ),
        };
        let last = procs.last_mut().expect("a process started");
        let bound = report.wait(&mut last.child, last.name);
        let metrics_addr = bound.get("metrics");
        let http_addr = bound.find("http");
        let edge_addr = bound.find("edge.tcp");
        std::thread::sleep(Duration::from_secs(1));
        // `run` serves the orders API and the gateway when it has both keys; watch through them.
        let has_fanout = runs_all
            && ["AUTH_KEY_DIR", "SERVICE_KEY"]
                .iter()
                .all(|k| std::env::var(k).is_ok_and(|v| !v.is_empty()))
            && bound.find("ws").is_some();
        let viewer_path = if has_fanout { "gateway" } else { "broker" };

        for (n, &rate) in rates.iter().enumerate() {
            let m0 = scrape(metrics_addr).unwrap_or_default();
            let cpu0: Vec<f64> = procs.iter().map(|p| common::cpu_seconds(p.pid())).collect();
            let redis_cpu0 = common::redis_cpu_seconds(&redis_url);
            let pg_cpu0 = common::cpu_seconds_named("postgres");
            let report = dir.join(format!("{mode}-{rate}.json"));
            let connections = (rate / 8000).clamp(2, 16);
            let mut sim = Command::new(BIN);
            sim.args(["simulate", "--orders", &orders]);
            if phones_via_edge {
                // One connection per courier, 10 points a second each (under the edge's
                // default 20/s per courier), as the phones of a busy city would.
                sim.args([
                    "--interval",
                    "0.1",
                    "--couriers",
                    &(rate / 10).max(1).to_string(),
                ])
                .env("EDGE_LISTEN", edge_addr.expect("run's edge").to_string());
            } else {
                sim.args(["--interval", "1", "--couriers", &rate.to_string()])
                    .args(["--connections", &connections.to_string()]);
            }
            sim.args([
                "--seconds",
                &step.to_string(),
                "--id-prefix",
                &format!("s{n}x"),
            ])
            .arg("--report")
            .arg(&report)
            .args(
                has_fanout
                    .then(|| {
                        [
                            "--orders-api".to_string(),
                            format!("http://{}", http_addr.expect("run's HTTP")),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .arg("--config")
            .arg(&config)
            .env("MQTT_URL", format!("mqtt://{mqtt}"))
            .env("REDIS_URL", &redis_url)
            .env("RUST_LOG", "warn");
            let mut sim = spawn(
                "simulate",
                &mut sim,
                &dir.join(format!("sim-{mode}-{rate}.log")),
            );
            let deadline = Instant::now() + Duration::from_secs_f64(step + 60.0);
            while sim.child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    eprintln!("simulator overran its step; stopping it");
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(sim);
            // Let ingest drain what is queued before reading its counters.
            std::thread::sleep(Duration::from_secs(2));
            let m1 = scrape(metrics_addr).unwrap_or_default();
            let d = |name: &str, label: Option<&str>| -> Option<f64> {
                Some(metric(&m1, name, label)? - metric(&m0, name, label).unwrap_or(0.0))
            };
            let r: serde_json::Value = std::fs::read(&report)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(serde_json::Value::Null);
            let sent = r["sent"].as_u64().unwrap_or(0);
            let received = d("ingest_messages_received_total", None).unwrap_or(0.0);
            let accepted = d("ingest_points_total", Some("result=\"accepted\"")).unwrap_or(0.0);
            let ms = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |v| format!("{v:.1}"));
            let mut cpu = Vec::new();
            let mut rss = Vec::new();
            for (p, c0) in procs.iter().zip(&cpu0) {
                let us = (common::cpu_seconds(p.pid()) - c0) * 1e6 / sent.max(1) as f64;
                cpu.push(format!("{} {us:.1}", p.name));
                rss.push(format!(
                    "{} {:.0}",
                    p.name,
                    common::status_kib(p.pid(), "VmRSS:") as f64 / 1024.0
                ));
            }
            let sim_cpu = r["cpu_seconds"].as_f64().unwrap_or(0.0) * 1e6 / sent.max(1) as f64;
            cpu.push(format!("sim {sim_cpu:.1}"));
            // Redis's share of the box is what ingest's batch script gets done with.
            let redis_cpu =
                (common::redis_cpu_seconds(&redis_url) - redis_cpu0) * 1e6 / sent.max(1) as f64;
            cpu.push(format!("redis {redis_cpu:.1}"));
            if runs_all {
                let pg =
                    (common::cpu_seconds_named("postgres") - pg_cpu0) * 1e6 / sent.max(1) as f64;
                cpu.push(format!("postgres {pg:.1}"));
            }
            rss.push(format!(
                "sim {:.0}",
                r["max_rss_kib"].as_f64().unwrap_or(0.0) / 1024.0
            ));
            let row = Row {
                mode: mode.to_string(),
                rate,
                sent,
                sent_rate: r["rate"].as_f64().unwrap_or(0.0),
                received,
                accepted,
                lost_pct: if sent == 0 {
                    0.0
                } else {
                    // What never reached the live index, wherever it was dropped (the next
                    // columns say where): the simulator sends no invalid or stale points.
                    ((sent as f64 - accepted) / sent as f64 * 100.0).max(0.0)
                },
                cursor_jumps: if runs_all {
                    Some(d("broker_cursor_jumps_total", None).unwrap_or(0.0))
                } else {
                    None
                },
                queue_dropped: d("ingest_queue_dropped_total", None).unwrap_or(0.0),
                reconnects: d(
                    "mqtt_connection_events_total",
                    Some("state=\"disconnected\""),
                )
                .unwrap_or(0.0),
                history: d("history_rows_written_total", None),
                delay: format!(
                    "{} / {} ms",
                    ms(&r["delay"]["p50_ms"]),
                    ms(&r["delay"]["p99_ms"])
                ),
                viewer_path,
                cpu: cpu.join(", "),
                rss: rss.join(", "),
            };
            println!("{}", row.line());
            rows.push(row);
        }
        drop(procs);
        psql(&database_url, &format!("DROP SCHEMA {schema} CASCADE"));
        let keys = courier_wire::Keys::with_prefix(&prefix);
        if let Ok(mut c) = redis::Client::open(redis_url.as_str()).and_then(|c| c.get_connection())
        {
            let _: Result<(), _> = redis::cmd("DEL")
                .arg(&keys.live)
                .arg(&keys.seen)
                .arg(&keys.seq)
                .arg(&keys.order)
                .arg(&keys.order_courier)
                .arg(&keys.orders_ended)
                .query(&mut c);
            // Recorded answers of the `delivered` events (kept for idempotency_ttl otherwise).
            let mut cursor = 0u64;
            loop {
                let Ok((next, found)) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}*", keys.order_event_idem))
                    .arg("COUNT")
                    .arg(1000)
                    .query::<(u64, Vec<String>)>(&mut c)
                else {
                    break;
                };
                if !found.is_empty() {
                    let _: Result<(), _> = redis::cmd("DEL").arg(&found).query(&mut c);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
    let mut text = format!(
        "Whole pipeline, steps of {step} s, couriers = rate (one point a second each), {orders} watched orders (viewer path per row: `gateway` = orders API + viewer gateway over WebSocket, `broker` = track/<order> on the broker), ingest workers {workers}; took {:.0} s.\n\n{}\n",
        started.elapsed().as_secs_f64(),
        header()
    );
    for r in &rows {
        text.push_str(&r.line());
        text.push('\n');
    }
    std::fs::write(&table, &text).unwrap();
    println!("table written to {}", table.display());
    let _ = std::fs::remove_dir_all(&dir);
}
