//! The live path under rising load: embedded broker (`courier-pipeline broker`), ONE ingest
//! worker (`courier-pipeline ingest`), real Redis, and the simulator as load, each its own
//! process on this box. Prints, per rate: sent, received by ingest, accepted, duplicates, lost
//! (sent minus accepted), where it was lost (ingest's queue, the broker's CursorJump alerts;
//! the rest is the broker dropping silently), ingest CPU µs per point, Redis CPU µs per point
//! (`INFO cpu`), of which the batch script's own time (`INFO commandstats`, EVALSHA's usec;
//! the rest is Redis reading requests and writing replies, its event loop and the sweeps) and
//! of that the ZADDs' (`zadd_us`: the live index and `seen`), the
//! mean batch size, ingest RSS, the broker's and the simulator's CPU µs per point sent (so
//! a row shows where the machine's cores went), and `mem_ns`: one dependent memory load timed
//! just before the step (`common::memory_probe_ns`), how fast the host let this machine reach
//! its memory then.
//!
//! Run: `./dev bench` (or `cargo bench --bench live_path` with REDIS_URL set).
//! Env: BENCH_RATES (msg/s, comma-separated; default 10000,20000,40000,60000,80000),
//! BENCH_SECONDS (per step; default 10), BENCH_WARMUP (seconds of the same load before each
//! step, default 4: every courier has sent twice when the step starts, so the per-point figures
//! are a running fleet's, not its first points' inserts; `sent`, `lost` and the `sim_us` cover
//! the warm-up too; 0: the step alone, as before 2026-12-01 evening), BENCH_WORKERS (ingest workers in the one ingest
//! process, each its own MQTT client in the `$share/ingest` group; default 1),
//! BENCH_INGEST_BIN (the `courier-pipeline` binary that runs ingest, e.g. an older build to
//! compare with; default this build), BENCH_SIM_BIN (the same for the simulator; the broker is
//! always this build),
//! BENCH_ORDERS (share of couriers carrying an order with places, e.g. 0.2; default 0: each rate
//! then runs three times: without orders, with orders (tracks), with orders that have places
//! (tracks and arrival detection), so the rows show what each costs per point, and how many
//! arrivals were detected), BENCH_LOAD (`sim`: the simulator, thousands of MQTT clients, as
//! phones connect; `raw`: `common/raw_load.rs`, the same payloads as PUBLISH frames in large
//! writes over BENCH_LOAD_CONNECTIONS plain TCP connections (default 4), so the load takes a
//! small share of the cores; default `sim`). `sim_us` is the load's CPU per point either way.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

/// A port chosen before the process starts ([`common::free_addr`]: below the ephemeral range).
fn free_port() -> u16 {
    common::free_addr().port()
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn metrics(port: u16) -> String {
    metrics_path(port, "/metrics")
}

fn metrics_path(port: u16, path: &str) -> String {
    common::http_get(&format!("http://127.0.0.1:{port}{path}"))
        .filter(|a| a.status == 200)
        .map(|a| a.text())
        .unwrap_or_default()
}

/// Sum of the samples of `name` whose labels contain `label` (empty: any).
fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{'))
        })
        .filter(|l| label.is_empty() || l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until a process's `/readyz` answers 200 (probing the MQTT port itself would make
/// rumqttd log an aborted connection).
fn wait_ready(metrics_port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::http_get(&format!("http://127.0.0.1:{metrics_port}/readyz"))
        .is_none_or(|a| a.status != 200)
    {
        assert!(Instant::now() < deadline, "port {metrics_port} never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and a benchmark has no business inside the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        println!("live_path: benchmark skipped (run it with ./dev bench)");
        return;
    }
    let redis_url = std::env::var("REDIS_URL").expect("set REDIS_URL (./dev bench does)");
    let rates: Vec<u64> = std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| "10000,20000,40000,60000,80000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let seconds: u64 = common::env_or("BENCH_SECONDS", 10);
    let warmup: u64 = common::env_or("BENCH_WARMUP", 4);
    let workers: usize = common::env_or("BENCH_WORKERS", 1);
    let raw = match std::env::var("BENCH_LOAD").as_deref() {
        Ok("raw") => true,
        Ok("sim") | Err(_) => false,
        Ok(other) => panic!("BENCH_LOAD={other}: sim or raw"),
    };
    let ingest_bin = std::env::var("BENCH_INGEST_BIN").unwrap_or_else(|_| BIN.to_string());
    let dir = std::env::temp_dir().join(format!("live-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = format!("bench{}:", std::process::id());
    let conf = dir.join("bench.toml");
    std::fs::write(
        &conf,
        format!(
            "[redis]\nkey_prefix = \"{prefix}\"\n\n[ingest]\nworkers = {workers}\n{}\n",
            std::env::var("BENCH_INGEST_EXTRA")
                .unwrap_or_default()
                .replace(';', "\n")
        ),
    )
    .unwrap();
    let (mqtt, broker_metrics, ingest_metrics) = (free_port(), free_port(), free_port());
    // The broker checks logins; ingest and the simulator log in with bus tokens they mint with
    // a bus key of this run.
    let key_dir = dir.join("keys");
    std::fs::create_dir_all(&key_dir).unwrap();
    let bus_key = courier_auth::SigningKey::generate(courier_auth::Audience::Bus).unwrap();
    std::fs::write(key_dir.join("bus.key"), bus_key.to_pem()).unwrap();
    std::fs::write(key_dir.join("bus.pub"), bus_key.public().to_pem()).unwrap();
    std::env::set_var("AUTH_KEY_DIR", &key_dir);

    let broker = Proc(
        Command::new(BIN)
            .args(["broker"])
            .env("MQTT_LISTEN", format!("127.0.0.1:{mqtt}"))
            .env("METRICS_LISTEN", format!("127.0.0.1:{broker_metrics}"))
            .env_remove("MQTT_URL")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(broker_metrics);
    let ingest = Proc(
        Command::new(&ingest_bin)
            .args(["--config", conf.to_str().unwrap(), "ingest"])
            .env("MQTT_URL", format!("mqtt://127.0.0.1:{mqtt}"))
            .env("REDIS_URL", &redis_url)
            .env("METRICS_LISTEN", format!("127.0.0.1:{ingest_metrics}"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(ingest_metrics);
    let ipid = ingest.0.id();
    let bpid = broker.0.id();

    let load = if raw {
        "raw PUBLISH frames (benches/common/raw_load.rs)"
    } else {
        "simulator"
    };
    println!("live path: embedded rumqttd (own process) -> {workers} ingest worker(s) (one process: {ingest_bin}) -> Redis; {load} as load; {seconds} s per rate after {warmup} s of warm-up");
    println!(
        "{:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>7} {:>8} {:>8} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "rate/s",
        "sent",
        "received",
        "accepted",
        "dups",
        "lost",
        "lost%",
        "q.drops",
        "b.alerts",
        "cpu_us/pt",
        "redis_us/pt",
        "script_us/pt",
        "zadd_us",
        "batch",
        "rss_MiB",
        "peak_MiB",
        "broker_us",
        "sim_us",
        "mem_ns"
    );
    let orders: f64 = common::env_or("BENCH_ORDERS", 0.0);
    // With orders, a notify process relays the events to a local receiver (answering 204), so
    // the rows show events detected and delivered while ingest takes the rate.
    let hook = Hook::start();
    let notify_http = free_port();
    let notify_proc = (orders > 0.0).then(|| {
        let database_url =
            std::env::var("DATABASE_URL").expect("set DATABASE_URL (./dev bench does)");
        let p = Proc(
            Command::new(BIN)
                .args(["--config", conf.to_str().unwrap(), "notify"])
                .env("REDIS_URL", &redis_url)
                .env("DATABASE_URL", database_url)
                .env("HTTP_LISTEN", format!("127.0.0.1:{notify_http}"))
                .env("METRICS_LISTEN", "off")
                .env("SERVICE_KEY", "bench-service-key-0123456789")
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        hook.register(notify_http);
        p
    });
    let raw_connections: usize = common::env_or("BENCH_LOAD_CONNECTIONS", 4);
    let raw_token = bus_key.sign(&courier_auth::Claims::bus(
        "simulator",
        courier_wire::clock::unix_now() as u64,
        24 * 3600,
    ));
    let step = |rate: u64, id_prefix: String, label: &str| {
        let mem_ns = common::memory_probe_ns();
        let hook0 = hook.count();
        let notify_cpu0 = notify_proc
            .as_ref()
            .map_or(0.0, |p| common::cpu_seconds(p.0.id()));
        let couriers = (rate * 2).clamp(1000, 200_000); // every courier sends every 2 s
        let interval = couriers as f64 / rate as f64;
        let before = metrics(ingest_metrics);
        let b_before = metric(&metrics(broker_metrics), "broker_cursor_jumps_total", "");
        let rx0 = metric(&before, "ingest_messages_received_total", "");
        let acc0 = metric(&before, "ingest_points_total", "result=\"accepted\"");
        let stale0 = metric(&before, "ingest_points_total", "result=\"stale\"");
        let qdrop0 = metric(&before, "ingest_queue_dropped_total", "");
        let arrivals0 = metric(&before, "ingest_arrivals_total", "");
        let sim_cpu0 = common::reaped_children_cpu_seconds();
        // The load runs for the warm-up and the step; the per-point figures come from the step
        // alone (every courier has sent before it, as in a running fleet), the losses from both.
        let ((sent, raw_cpu), w) = std::thread::scope(|s| {
            let load = s.spawn(|| {
                if raw {
                    let l = common::raw_load::RawLoad {
                        addr: format!("127.0.0.1:{mqtt}"),
                        token: raw_token.clone(),
                        couriers,
                        rate,
                        seconds: warmup + seconds,
                        connections: raw_connections,
                        id_prefix: id_prefix.clone(),
                    }
                    .run();
                    (l.points as f64, l.cpu_seconds)
                } else {
                    let sent = simulate(couriers, interval, warmup + seconds, mqtt, &id_prefix);
                    (sent, 0.0)
                }
            });
            std::thread::sleep(Duration::from_secs(warmup));
            let w = Window::start(&metrics(ingest_metrics), ipid, bpid, &redis_url);
            (load.join().unwrap(), w)
        });
        // Let ingest drain: received stops moving.
        let mut last = -1.0;
        let mut text = metrics(ingest_metrics);
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(250));
            text = metrics(ingest_metrics);
            let now = metric(&text, "ingest_points_total", "");
            if now == last {
                break;
            }
            last = now;
        }
        let cpu = common::cpu_seconds(ipid) - w.cpu;
        let broker_cpu = common::cpu_seconds(bpid) - w.broker_cpu;
        let sim_cpu = common::reaped_children_cpu_seconds() - sim_cpu0 + raw_cpu;
        let redis_cpu = common::redis_cpu_seconds(&redis_url) - w.redis_cpu;
        let script_us = common::redis_command_usec(&redis_url, "evalsha") - w.script_us;
        let zadd_us = common::redis_command_usec(&redis_url, "zadd") - w.zadd_us;
        let in_step = metric(&text, "ingest_messages_received_total", "") - w.received;
        let received = metric(&text, "ingest_messages_received_total", "") - rx0;
        let accepted = metric(&text, "ingest_points_total", "result=\"accepted\"") - acc0;
        let alerts = metric(&metrics(broker_metrics), "broker_cursor_jumps_total", "") - b_before;
        // Each simulated courier sends strictly rising seqs 2 s apart, so every point that reaches
        // ingest once is accepted: stale points here are duplicate deliveries by the broker, and
        // sent minus accepted is what was lost on the way.
        let dups = metric(&text, "ingest_points_total", "result=\"stale\"") - stale0;
        let lost = (sent - accepted).max(0.0);
        let qdrops = metric(&text, "ingest_queue_dropped_total", "") - qdrop0;
        let arrivals = metric(&text, "ingest_arrivals_total", "") - arrivals0;
        let batch = (metric(&text, "ingest_batch_size_sum", "") - w.batch_sum)
            / (metric(&text, "ingest_batch_size_count", "") - w.batches).max(1.0);
        println!(
            "{:>9} {:>9.0} {:>9.0} {:>9.0} {:>6.0} {:>9.0} {:>6.2}% {:>8.0} {:>8.0} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>7.0} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>7.0}",
            rate,
            sent,
            received,
            accepted,
            dups,
            lost,
            100.0 * lost / sent.max(1.0),
            qdrops,
            alerts,
            cpu * 1e6 / in_step.max(1.0),
            redis_cpu * 1e6 / in_step.max(1.0),
            script_us / in_step.max(1.0),
            zadd_us / in_step.max(1.0),
            batch,
            common::status_kib(ipid, "VmRSS:") as f64 / 1024.0,
            common::status_kib(ipid, "VmHWM:") as f64 / 1024.0,
            broker_cpu * 1e6 / in_step.max(1.0),
            sim_cpu * 1e6 / sent.max(1.0),
            mem_ns,
        );
        if !label.is_empty() {
            // The deliveries of this step's events, waited for a few seconds at most.
            let deadline = Instant::now() + Duration::from_secs(10);
            while (hook.count() - hook0) < arrivals as u64 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let notify_cpu = notify_proc
                .as_ref()
                .map_or(0.0, |p| common::cpu_seconds(p.0.id()))
                - notify_cpu0;
            let each = if arrivals > 0.0 {
                format!(" (notify CPU {:.0} µs each)", notify_cpu * 1e6 / arrivals)
            } else {
                String::new()
            };
            println!(
                "{:>9} ^ {label}: {arrivals:.0} arrivals detected ({:.0}/s), {} delivered as webhooks{each}",
                "",
                arrivals / (warmup + seconds) as f64,
                hook.count() - hook0,
            );
        }
    };
    for rate in rates {
        let couriers = (rate * 2).clamp(1000, 200_000);
        step(rate, format!("r{rate}-"), "");
        if orders > 0.0 {
            // The same couriers again (same seed: same starting places, new ids), a share of
            // them now carrying an order whose pickup is where the first run left them (a
            // minute's ride at most) and whose drop-off is across town: arrival detection runs
            // on each of their points and fires as they pass.
            let carriers = ((couriers as f64) * orders) as u64;
            seed_orders(&redis_url, &prefix, rate, "b", carriers, false);
            step(rate, format!("r{rate}b-"), "orders, no places: tracks");
            seed_orders(&redis_url, &prefix, rate, "c", carriers, true);
            step(
                rate,
                format!("r{rate}c-"),
                "orders with places: tracks and arrival",
            );
        }
    }
    drop(notify_proc);
    drop(ingest);
    drop(broker);
    let _ = Command::new("redis-cli")
        .args(["-u", &redis_url, "DEL"])
        .args(
            [
                "couriers:live",
                "couriers:seen",
                "courier:order",
                "couriers:seq",
                "order:courier",
                "order:places",
                "events",
            ]
            .map(|k| format!("{prefix}{k}")),
        )
        .stdout(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(dir);
}

/// Before a later run of a rate (ids `r<rate><run>-`): `carriers` of its couriers get an order
/// each; with `places`, its pickup is where the same courier of the first run ended and its
/// drop-off across the box. Order ids hold this process's id: the outbox of an earlier run
/// would take the same events for duplicates.
fn seed_orders(redis_url: &str, prefix: &str, rate: u64, run: &str, carriers: u64, places: bool) {
    let mut c = redis::Client::open(redis_url)
        .unwrap()
        .get_connection()
        .unwrap();
    let live = format!("{prefix}couriers:live");
    let first: Vec<String> = (0..carriers).map(|i| format!("r{rate}-{i:05}")).collect();
    let mut pos: Vec<Option<(f64, f64)>> = Vec::new();
    for chunk in first.chunks(1000) {
        let got: Vec<Option<(f64, f64)>> = redis::cmd("GEOPOS")
            .arg(&live)
            .arg(chunk)
            .query(&mut c)
            .unwrap();
        pos.extend(got);
    }
    let keys = courier_wire::Keys::with_prefix(prefix);
    let mut pipe = redis::pipe();
    for (i, p) in pos.iter().enumerate() {
        let Some((lon, lat)) = p else { continue };
        let (courier, order) = (
            format!("r{rate}{run}-{i:05}"),
            format!("o{}-{rate}{run}-{i}", std::process::id()),
        );
        pipe.hset(&keys.order, &courier, &order)
            .hset(&keys.order_courier, &order, &courier)
            .ignore();
        if places {
            let p = courier_wire::events::Places::new(Some((*lat, *lon)), Some((24.61, 46.56)));
            pipe.hset(&keys.order_places, &order, p.encode()).ignore();
        }
    }
    let _: () = pipe.query(&mut c).unwrap();
}

/// A local webhook receiver (204 to every POST) on its own thread, counting what it got.
struct Hook {
    addr: std::net::SocketAddr,
    got: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Runs the server; kept for as long as the receiver.
    _rt: std::sync::Arc<tokio::runtime::Runtime>,
}

impl Hook {
    fn start() -> Hook {
        let rt = std::sync::Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
        );
        let got = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let g = got.clone();
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = l.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                g.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async { axum::http::StatusCode::NO_CONTENT }
            }),
        );
        rt.spawn(async move { axum::serve(l, app).await.unwrap() });
        Hook { addr, got, _rt: rt }
    }

    fn count(&self) -> u64 {
        self.got.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers this receiver for arrivals with the notify process's API (waiting for it).
    fn register(&self, notify_http: u16) {
        let url = format!("http://{}/hook", self.addr);
        let body = format!(
            r#"{{"tenant":"default","url":"{url}","kinds":["courier.arriving_pickup","courier.arriving_dropoff"]}}"#
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = common::http_post_json(
                &format!("http://127.0.0.1:{notify_http}/webhooks/endpoints"),
                &[("authorization", "Bearer bench-service-key-0123456789")],
                &body,
            );
            match answer.as_ref().map(|a| a.status) {
                Some(201) => return,
                _ if Instant::now() > deadline => {
                    panic!(
                        "notify did not take the endpoint: {:?}",
                        answer.map(|a| (a.status, a.text()))
                    )
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

/// Where the counters stood when a step's measured part began (after its warm-up).
struct Window {
    received: f64,
    batch_sum: f64,
    batches: f64,
    cpu: f64,
    broker_cpu: f64,
    redis_cpu: f64,
    script_us: f64,
    zadd_us: f64,
}

impl Window {
    fn start(ingest: &str, ingest_pid: u32, broker_pid: u32, redis_url: &str) -> Self {
        Window {
            received: metric(ingest, "ingest_messages_received_total", ""),
            batch_sum: metric(ingest, "ingest_batch_size_sum", ""),
            batches: metric(ingest, "ingest_batch_size_count", ""),
            cpu: common::cpu_seconds(ingest_pid),
            broker_cpu: common::cpu_seconds(broker_pid),
            redis_cpu: common::redis_cpu_seconds(redis_url),
            script_us: common::redis_command_usec(redis_url, "evalsha"),
            zadd_us: common::redis_command_usec(redis_url, "zadd"),
        }
    }
}

/// One simulator run against the broker; returns the points it says it sent.
fn simulate(couriers: u64, interval: f64, seconds: u64, mqtt: u16, id_prefix: &str) -> f64 {
    let bin = std::env::var("BENCH_SIM_BIN").unwrap_or_else(|_| BIN.into());
    let sim = Command::new(bin)
        .args([
            "simulate",
            "--couriers",
            &couriers.to_string(),
            "--interval",
            &format!("{interval}"),
            "--connections",
            "8",
            "--seconds",
            &seconds.to_string(),
            "--id-prefix",
            id_prefix,
        ])
        .env("MQTT_URL", format!("mqtt://127.0.0.1:{mqtt}"))
        .env("METRICS_LISTEN", "off")
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&sim.stdout);
    line.split("; sent ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}
