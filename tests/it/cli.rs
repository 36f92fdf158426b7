//! The binary as users and scripts see it: help, configuration errors, and `run` end to end
//! with a graceful SIGTERM.

use crate::support;

/// The point `run` is sent (see the log check).
const LAT: f64 = 24.7135791;
const LON: f64 = 46.7246813;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

#[test]
fn help_lists_the_roles() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "ingest", "broker", "edge", "simulate"] {
        assert!(text.contains(cmd), "--help does not list {cmd}:\n{text}");
    }
}

#[test]
fn a_bad_setting_stops_start_up_with_one_line_naming_it() {
    for (var, value) in [
        ("MQTT_LISTEN", "nope"),
        ("REDIS_URL", "localhost:6379"),
        ("MQTT_URL", "http://x"),
        ("METRICS_LISTEN", "x"),
    ] {
        let out = Command::new(BIN)
            .arg("ingest")
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{var}={value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "expected one line, got:\n{err}");
        assert!(lines[0].contains(var), "{:?} does not name {var}", lines[0]);
    }
    let dir = std::env::temp_dir().join(format!("cli-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("bad.toml");
    std::fs::write(&conf, "[ingest]\nbatch_max = 0\n").unwrap();
    let out = Command::new(BIN)
        .args(["--config", conf.to_str().unwrap(), "ingest"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ingest.batch_max"));
    // A cluster whose key prefix has no hash tag: refused before anything connects (the
    // batch script's keys would fall into different slots and every call fail CROSSSLOT).
    std::fs::write(&conf, "[redis]\nkey_prefix = \"riyadh:\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["--config", conf.to_str().unwrap(), "ingest"])
        .env(
            "REDIS_CLUSTER_NODES",
            "redis://127.0.0.1:1,redis://127.0.0.1:2",
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("redis.key_prefix") && err.contains("hash tag"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `GET /metrics`: the text, empty while nothing answers 200.
fn scrape(addr: std::net::SocketAddr) -> String {
    match get_blocking(addr, "/metrics") {
        Some((200, text)) => text,
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_a_point_serves_metrics_and_stops_on_sigterm() {
    // rumqttd binds its own listener and cannot report a port 0: the bus port is chosen here.
    // Every other listener is bound on port 0 by `run` itself and read back from its report.
    let mqtt = free_addr();
    let prefix = prefix();
    let dir = std::env::temp_dir().join(format!("cli-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("run.toml");
    std::fs::write(&conf, format!("[redis]\nkey_prefix = \"{prefix}\"\n")).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--config", conf.to_str().unwrap(), "run"])
        .env_remove("MQTT_URL")
        .env("MQTT_LISTEN", mqtt.to_string())
        .env("EDGE_LISTEN", "127.0.0.1:0")
        .env("METRICS_LISTEN", "127.0.0.1:0")
        .env("HTTP_LISTEN", "127.0.0.1:0")
        .env("WS_LISTEN", "127.0.0.1:0")
        .env("REDIS_URL", &services().redis_url)
        .env("DATABASE_URL", &services().database_url)
        .env("AUTH_KEY_DIR", test_key_dir())
        .env("SERVICE_KEY", TEST_SERVICE_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let report = ListenReport::on(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let bound = report.wait(&mut child, "run");
    let (metrics, http, ws, edge) = (
        bound.get("metrics"),
        bound.get("http"),
        bound.get("ws"),
        bound.get("edge.tcp"),
    );
    assert_eq!(bound.get("broker"), mqtt);
    // Real ports, each accepting once the report is written (nothing to wait for). Not the
    // bus: rumqttd logs a connection closed before CONNECT as an ERROR, checked below.
    for addr in [metrics, http, ws, edge] {
        assert_ne!(addr.port(), 0, "{bound:?}");
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e} ({bound:?})"));
    }
    // The URLs handed out name the port bound, not port 0: the orders API's tracking link.
    let order = format!("o-{:x}", rand::random::<u32>());
    let service = [("Authorization", format!("Bearer {TEST_SERVICE_KEY}"))];
    let service: Vec<(&str, &str)> = service.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let assigned = http_post(
        http,
        &format!("/orders/{order}/assign"),
        &service,
        r#"{"courier_id":"cli1"}"#,
    )
    .await;
    assert_eq!(assigned.status, 200, "{assigned:?}");
    let t = http_post(
        http,
        &format!("/orders/{order}/tracking-token"),
        &service,
        r#"{"viewer":"customer"}"#,
    )
    .await;
    assert_eq!(t.status, 200, "{t:?}");
    assert_eq!(t.body["ws_url"], format!("ws://{ws}/mqtt"), "{t:?}");
    assert!(
        t.body["tracking_url"]
            .as_str()
            .is_some_and(|u| u.starts_with(&format!("http://{http}/track/{order}?"))),
        "{t:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while scrape(metrics).is_empty() {
        assert!(Instant::now() < deadline, "metrics endpoint never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The phone logs in at the edge with his device token; the edge hands the point to the
    // embedded bus in-process.
    let now = courier_wire::clock::unix_now() as u64;
    let endpoint = courier_wire::MqttEndpoint {
        username: Some("cli1".into()),
        password: Some(sign(&courier_auth::Claims::courier("cli1", now, 600))),
        ..courier_wire::MqttEndpoint::new("127.0.0.1", edge.port())
    };
    let (c, _h) = client(&endpoint, None).await;
    // Ingest subscribes right after it connects; keep sending rising seqs until one is taken.
    let t = courier_wire::clock::unix_now() - 1.0;
    let mut seq = 0;
    let accepted = loop {
        seq += 1;
        publish(
            &c,
            "couriers/cli1/loc",
            point("cli1", LAT, LON, t + seq as f64 * 0.01, seq),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let text = scrape(metrics);
        if text.contains("ingest_points_total{result=\"accepted\"}") {
            break text;
        }
        assert!(Instant::now() < deadline, "no point accepted");
    };
    assert!(accepted.contains("ingest_messages_received_total"));
    let health = |url: String| {
        Command::new(BIN)
            .args(["health", &url])
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(health(format!("http://{metrics}/healthz")));
    // Every role of `run` reports its connections; the point went through, so all are up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !health(format!("http://{metrics}/readyz")) {
        assert!(
            Instant::now() < deadline,
            "never ready: {:?}",
            get_blocking(metrics, "/readyz")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, ready) = get_blocking(metrics, "/readyz").unwrap();
    for check in [
        "broker",
        "ingest.mqtt",
        "ingest.redis",
        "history.mqtt",
        "history.postgres",
        "edge.bus",
    ] {
        assert!(
            ready.contains(&format!("\"{check}\":true")),
            "{check} missing: {ready}"
        );
    }
    assert!(!health(format!("http://{metrics}/nothing-here")));
    let (_closed, nobody) = refused_addr();
    assert!(!health(format!("http://{nobody}/healthz")));
    // The public keys it accepts, as a JWKS other verifiers can use: one per audience here,
    // each under its kid, and nothing private.
    let jwks = http_get(http, "/.well-known/jwks.json", None).await;
    assert_eq!(jwks.status, 200, "{}", jwks.body);
    let keys = jwks.json()["keys"].as_array().unwrap().clone();
    assert_eq!(
        keys.len(),
        courier_auth::Audience::ALL.len(),
        "{}",
        jwks.body
    );
    for aud in courier_auth::Audience::ALL {
        let kid = test_verifier(aud).kids()[0].to_string();
        assert!(
            keys.iter().any(|k| k["kid"] == kid && k["alg"] == "EdDSA"),
            "{aud}"
        );
    }
    assert!(keys.iter().all(|k| k.get("d").is_none()));

    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "run did not stop after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "exit {status:?}; stderr:\n{err}");
    assert!(err.contains("stopped cleanly"), "{err}");
    // A clean run ends without an ERROR line (rumqttd's `router-drop` for every worker that
    // disconnects is filtered, src/telemetry.rs).
    assert!(
        !err.contains(" ERROR "),
        "an ERROR line in a clean run:\n{err}"
    );
    // stderr is a pipe here, not a terminal: plain text, no colour codes.
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escape codes in a non-terminal log:\n{err}"
    );
    // Coordinates never reach the logs. Digits long enough not to turn up in a timestamp
    // (`...:46.7xxxxxZ` once did for a check of "46.7").
    assert!(
        !err.contains("24.71357") && !err.contains("46.72468"),
        "coordinates in logs:\n{err}"
    );
    let keys = courier_wire::Keys::with_prefix(&prefix);
    cleanup(&keys).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    // The broker role is rumqttd alone, which cannot report a port 0: chosen here.
    let mqtt = free_addr();
    let mut child = Command::new(BIN)
        .arg("broker")
        .env_remove("MQTT_URL")
        .env("LOG_FORMAT", "json")
        .env("AUTH_KEY_DIR", test_key_dir())
        .env("MQTT_LISTEN", mqtt.to_string())
        .env("METRICS_LISTEN", "off")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(mqtt).is_err() {
        assert!(Instant::now() < deadline, "broker never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() >= 2, "{err}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{l}");
    }
}

#[test]
fn the_embedded_broker_will_not_admit_anyone_without_keys() {
    // Refused at start, with the error on stderr: no key directory, or one without bus keys.
    let refused = |dir: Option<&std::path::Path>| {
        let mut cmd = Command::new(BIN);
        // Held, not listening: had the broker bound anything before checking its keys, it
        // would fail with another error than the one expected below.
        let (_held, listen) = refused_addr();
        cmd.arg("broker")
            .env_remove("MQTT_URL")
            .env("MQTT_LISTEN", listen.to_string())
            .env("METRICS_LISTEN", "off");
        match dir {
            Some(d) => cmd.env("AUTH_KEY_DIR", d),
            None => cmd.env_remove("AUTH_KEY_DIR"),
        };
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(None);
    assert!(
        err.lines().any(|l| l.starts_with("error: AUTH_KEY_DIR")),
        "{err}"
    );
    // A key directory without bus keys (an edge's) is no better.
    let dir = std::env::temp_dir().join(format!("broker-no-bus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(test_key_dir().join("courier.pub"), dir.join("courier.pub")).unwrap();
    let err = refused(Some(&dir));
    assert!(err.contains("has no bus.pub"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn readyz_says_no_while_the_broker_is_unreachable() {
    let (_closed, nobody) = refused_addr();
    let mut cmd = Command::new(BIN);
    cmd.arg("ingest")
        .env("MQTT_URL", format!("mqtt://{nobody}"))
        .env("METRICS_LISTEN", "127.0.0.1:0")
        .env("REDIS_URL", &services().redis_url)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let report = ListenReport::on(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let metrics = report.wait(&mut child, "ingest").get("metrics");
    let deadline = Instant::now() + Duration::from_secs(20);
    // Ready to judge once ingest has reached Redis (the broker it is given never answers).
    let (status, ready) = loop {
        match get_blocking(metrics, "/readyz") {
            Some((s, body)) if body.contains("\"ingest.redis\":true") => break (s, body),
            r => assert!(Instant::now() < deadline, "never reached Redis: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 503, "{ready}");
    assert!(
        ready.contains("\"ingest.mqtt\":false") && ready.contains("\"ingest.redis\":true"),
        "{ready}"
    );
}

/// The APIs' HTTP listener as a slow or greedy client would try it: idle connections that never
/// finish their headers are closed at the header timeout (so a full house of them delays a real
/// request by that timeout only), an oversize body gets 413, a request stuck in its handler 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_listener_bounds_slow_and_greedy_clients() {
    use axum::routing::{get, post};
    use courier_pipeline::http::{serve, HttpLimits};
    let app = axum::Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/echo",
            post(|b: axum::body::Bytes| async move { b.len().to_string() }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let limits = HttpLimits {
        header_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(300),
        max_body_bytes: 1024,
        max_connections: 4,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(serve(l, app, limits, stop.clone()));
    // Slowloris: every connection slot taken by a request that never ends its headers.
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n").unwrap();
        idle.push(s);
    }
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || get_blocking(addr, "/ok"))
        .await
        .unwrap();
    assert_eq!(answer.map(|a| a.0), Some(200));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a real request waited {:?} behind idle connections",
        started.elapsed()
    );
    // The idle ones were closed by the server (hyper answers 408 first), not left open.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("an idle connection was left open: {e}"),
        }
    }
    // A body over the limit, and a handler over its time.
    let big = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let body = vec![b'x'; 4096];
        write!(
            s,
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        let _ = s.write_all(&body);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
    .await
    .unwrap();
    assert!(big.starts_with("HTTP/1.1 413"), "{big}");
    let slow = tokio::task::spawn_blocking(move || get_blocking(addr, "/slow"))
        .await
        .unwrap();
    assert_eq!(slow.map(|a| a.0), Some(503));
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
