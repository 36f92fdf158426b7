//! Redis's cost per point of the batch script, measured inside Redis: no broker, no ingest
//! process, only batches as ingest builds them (`batch::plan` on real JSON payloads) sent to a
//! Redis by EVALSHA, four in flight. Each script variant gets its own key prefix, warmed so that
//! every courier already has seq state (the steady state of a running deployment), and the
//! variants run in turns, round after round, so a noisy machine hits them alike.
//!
//! Per round and variant it prints Redis's own CPU per point (`INFO cpu`) and, from `INFO
//! commandstats` (reset before each round), the EVALSHA time per point and the part of it spent
//! in each command the script calls; `lua` is EVALSHA minus those: the script's own work;
//! `points/s` is the rate of the round (this process builds the batches meanwhile, on the same
//! machine: a floor of what Redis takes).
//!
//! Run: `REDIS_URL=redis://127.0.0.1:6379/ cargo bench -p ingest --bench script`.
//! Env: SCRIPT_BENCH_COURIERS (120000), SCRIPT_BENCH_BATCH (256 points per call),
//! SCRIPT_BENCH_POINTS (points per round and variant, 300000), SCRIPT_BENCH_ROUNDS (3),
//! SCRIPT_BENCH_ORDERS (share of couriers carrying an order, 0.01), SCRIPT_BENCH_VARIANTS
//! (comma-separated, default `v1,current`), SCRIPT_BENCH_EXTRA (`name=file.lua:v1|current,...`:
//! more scripts to time, e.g. truncated copies of a script to profile its parts; layout
//! `fcall`: a Redis Function library registering `batch`, called with FCALL).
//!
//! `v1` is the script before the packed layout (`benches/v1.rs`: five ARGV strings per point,
//! state as text); `current` is `src/script.lua` with `batch::script_call`; `places` is
//! `current` with pickup and drop-off places on every order (50 km away, so no arrival fires):
//! what reading the places and returning them costs (docs/events.md); `bucketed` is `current`
//! writing `seen` once per SCRIPT_BENCH_SEEN_EVERY seconds (5; `ingest.seen_every`) instead of
//! for every point (how often a courier comes round is couriers / the round's rate: 120,000 at
//! 150,000 points/s is about every 0.8 s, phones send every 1-4 s). Before the Redis rounds it
//! prints ingest's own cost of the arrival rule per accepted point of a courier with an order.

mod v1;

use bytes::Bytes;
use courier_wire::{Keys, Validation};
use ingest::batch::{self, Message, Plan};
use rand::prelude::*;
use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const V1_LUA: &str = v1::LUA;
fn current_lua() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(ingest::sink::batch_lua)
}
const DEPTH: usize = 4;
const INNER: [&str; 7] = ["hmget", "geoadd", "zadd", "hset", "set", "get", "zrem"];

#[derive(Clone, Copy, PartialEq)]
enum Layout {
    V1,
    Current,
    /// The current layout, the script loaded as a Redis Function (`FUNCTION LOAD`; the file
    /// registers a function named `batch`) and called with FCALL.
    Function,
}

struct Variant {
    name: String,
    lua: String,
    layout: Layout,
    keys: Keys,
    sha: String,
    /// The full script of its layout: warms the state (a truncated copy may not write it).
    warm_sha: String,
    /// `ingest.seen_every`, seconds (0: `seen` for every point).
    seen_every: f64,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn args_for(v: &Variant, plan: &Plan<'_>, now: f64) -> Vec<Vec<u8>> {
    match v.layout {
        Layout::V1 => v1::args(plan, now, 30.0),
        Layout::Current | Layout::Function => {
            batch::script_call(plan, now, 30.0, v.seen_every).args
        }
    }
}

/// Points as the simulator sends them: every courier in turn, seq and phone time rising.
struct Load {
    couriers: Vec<String>,
    order: Vec<usize>,
    next: usize,
    seq: Vec<u64>,
    t0: f64,
    tick: u64,
    rng: StdRng,
}

impl Load {
    fn new(n: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(16);
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng);
        Load {
            couriers: (0..n).map(|i| format!("bench-c{i:06}")).collect(),
            order,
            next: 0,
            seq: vec![0; n],
            t0: unix_now() - 3000.0,
            tick: 0,
            rng,
        }
    }

    fn batch(&mut self, size: usize) -> Vec<Message> {
        let now = unix_now();
        (0..size)
            .map(|_| {
                let c = self.order[self.next];
                self.next = (self.next + 1) % self.order.len();
                self.seq[c] += 1;
                self.tick += 1;
                let id = &self.couriers[c];
                let lat = 24.6 + self.rng.random::<f64>() * 0.3;
                let lon = 46.5 + self.rng.random::<f64>() * 0.4;
                let ts = self.t0 + self.tick as f64 * 1e-3;
                let payload = format!(
                    r#"{{"id":"{id}","lat":{lat},"lon":{lon},"ts":{ts},"seq":{}}}"#,
                    self.seq[c]
                );
                Message {
                    topic: format!("couriers/{id}/loc"),
                    payload: Bytes::from(payload),
                    received: now,
                }
            })
            .collect()
    }
}

fn info(c: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(c).unwrap()
}

fn redis_cpu(c: &mut redis::Connection) -> f64 {
    info(c, "cpu")
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// `usec` of each command in `INFO commandstats`.
fn command_usec(c: &mut redis::Connection) -> HashMap<String, f64> {
    info(c, "commandstats")
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let usec = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("usec="))?
                .parse()
                .ok()?;
            Some((name.to_string(), usec))
        })
        .collect()
}

/// Sends `points` points of `load` through `v`, DEPTH calls per round trip.
fn run(
    c: &mut redis::Connection,
    v: &Variant,
    sha: &str,
    load: &mut Load,
    points: usize,
    size: usize,
) {
    let limits = Validation::default();
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut sent = 0;
    while sent < points {
        let batches: Vec<Vec<Message>> = (0..DEPTH).map(|_| load.batch(size)).collect();
        let now = unix_now();
        let mut pipe = redis::pipe();
        for msgs in &batches {
            let plan = batch::plan(msgs, &limits, now);
            assert_eq!(
                plan.entries.len(),
                msgs.len(),
                "the bench's points are valid"
            );
            // Every call its own record: a record id seen before returns the stored verdicts.
            let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let record = format!("{}{}-{n}", v.keys.batch_record, std::process::id());
            let k = &v.keys;
            let call = if v.layout == Layout::Function && sha == v.sha {
                pipe.cmd("FCALL").arg("batch")
            } else {
                pipe.cmd("EVALSHA").arg(sha)
            };
            // v1 reads the first five keys; the current layout takes the events cap last.
            call.arg(9)
                .arg(&ingest::sink::batch_keys(k, &record))
                .arg(args_for(v, &plan, now));
            if v.layout != Layout::V1 {
                call.arg(0);
            }
            sent += msgs.len();
        }
        let replies: Vec<redis::Value> = pipe.query(c).unwrap();
        for r in replies {
            assert!(matches!(r, redis::Value::Array(_)), "{r:?}");
        }
    }
}

/// Ingest's CPU for the arrival rule: decoding an order's places and checking a point against
/// both, as `worker::apply` does for each accepted point of a courier with an order.
fn arrival_cost() {
    let rule = ingest::IngestConfig::default().arrival();
    let places =
        courier_wire::events::Places::new(Some((24.7136, 46.6753)), Some((24.73, 46.69))).encode();
    let n = 2_000_000u32;
    let mut hits = 0usize;
    let t = Instant::now();
    for i in 0..n {
        let p = courier_wire::events::Places::decode(std::hint::black_box(&places)).unwrap();
        let at = (24.70 + f64::from(i % 1000) * 1e-5, 46.66);
        hits += rule.arrivals(std::hint::black_box(at), &p).count();
    }
    let per = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
    println!("arrival rule in ingest: {per:.0} ns per point of a courier with an order (decode + 2 places; {hits} hits)");
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("script: benchmark skipped (run it with cargo bench)");
        return;
    }
    let url = std::env::var("REDIS_URL").expect("set REDIS_URL");
    let couriers: usize = env("SCRIPT_BENCH_COURIERS", 120_000);
    let size: usize = env("SCRIPT_BENCH_BATCH", 256);
    let points: usize = env("SCRIPT_BENCH_POINTS", 300_000);
    let rounds: usize = env("SCRIPT_BENCH_ROUNDS", 3);
    let orders: f64 = env("SCRIPT_BENCH_ORDERS", 0.01);
    let names: String = env("SCRIPT_BENCH_VARIANTS", "v1,current".to_string());
    let extra: String = env("SCRIPT_BENCH_EXTRA", String::new());

    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let pid = std::process::id();
    let mut variants: Vec<Variant> = Vec::new();
    let seen_every: f64 = env("SCRIPT_BENCH_SEEN_EVERY", 5.0);
    let mut add = |name: &str, lua: String, layout: Layout, seen_every: f64| {
        let load = |c: &mut redis::Connection, code: &str| -> String {
            redis::cmd("SCRIPT").arg("LOAD").arg(code).query(c).unwrap()
        };
        let sha = if layout == Layout::Function {
            let _: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(&lua)
                .query(&mut c)
                .unwrap();
            "fcall".to_string()
        } else {
            load(&mut c, &lua)
        };
        let warm_sha = load(
            &mut c,
            match layout {
                Layout::V1 => V1_LUA,
                Layout::Current | Layout::Function => current_lua(),
            },
        );
        variants.push(Variant {
            warm_sha,
            name: name.to_string(),
            keys: Keys::with_prefix(&format!("scriptbench{pid}-{name}:")),
            lua,
            layout,
            sha,
            seen_every,
        });
    };
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "v1" => add("v1", V1_LUA.to_string(), Layout::V1, 0.0),
            "current" => add("current", current_lua().to_string(), Layout::Current, 0.0),
            "bucketed" => add(
                "bucketed",
                current_lua().to_string(),
                Layout::Current,
                seen_every,
            ),
            "places" => add("places", current_lua().to_string(), Layout::Current, 0.0),
            other => panic!("unknown variant {other}"),
        }
    }
    for spec in extra.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, rest) = spec.split_once('=').expect("name=file:layout");
        let (file, layout) = rest.rsplit_once(':').expect("name=file:layout");
        let layout = match layout {
            "v1" => Layout::V1,
            "current" => Layout::Current,
            "fcall" => Layout::Function,
            l => panic!("unknown layout {l}"),
        };
        add(name, std::fs::read_to_string(file).unwrap(), layout, 0.0);
    }

    // Orders, then one pass over every courier so each has seq state.
    let mut rng = StdRng::seed_from_u64(7);
    let carriers: Vec<usize> = (0..couriers)
        .filter(|_| rng.random::<f64>() < orders)
        .collect();
    let mut loads: Vec<Load> = Vec::new();
    for v in &variants {
        let mut load = Load::new(couriers);
        if !carriers.is_empty() {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(&v.keys.order);
            for &i in &carriers {
                cmd.arg(&load.couriers[i]).arg(format!("ord-{i}"));
            }
            let _: () = cmd.query(&mut c).unwrap();
            if v.name == "places" {
                let far = courier_wire::events::Places::new(Some((25.2, 46.6)), Some((25.2, 46.7)));
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&v.keys.order_places);
                for &i in &carriers {
                    cmd.arg(format!("ord-{i}")).arg(far.encode());
                }
                let _: () = cmd.query(&mut c).unwrap();
            }
        }
        let t = Instant::now();
        run(&mut c, v, &v.warm_sha, &mut load, couriers, size);
        eprintln!(
            "{}: warmed {couriers} couriers in {:.1} s ({} bytes of script)",
            v.name,
            t.elapsed().as_secs_f64(),
            v.lua.len()
        );
        loads.push(load);
    }

    arrival_cost();
    println!(
        "{couriers} couriers with state, {size} points per call, {DEPTH} calls in flight, {:.0}% carry an order; µs per point",
        orders * 100.0
    );
    let head: Vec<String> = INNER.iter().map(|s| format!("{s:>7}")).collect();
    println!(
        "{:>5} {:>10} {:>9} {:>8} {} {:>7} {:>9}",
        "round",
        "variant",
        "redis_cpu",
        "evalsha",
        head.join(" "),
        "lua",
        "points/s"
    );
    for round in 1..=rounds {
        for (v, load) in variants.iter().zip(loads.iter_mut()) {
            let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
            let cpu0 = redis_cpu(&mut c);
            let t = Instant::now();
            run(&mut c, v, &v.sha, load, points, size);
            let rate = points as f64 / t.elapsed().as_secs_f64();
            let cpu = redis_cpu(&mut c) - cpu0;
            let usec = command_usec(&mut c);
            let per = |name: &str| usec.get(name).copied().unwrap_or(0.0) / points as f64;
            let inner: Vec<f64> = INNER.iter().map(|n| per(n)).collect();
            let eval = per(if v.layout == Layout::Function {
                "fcall"
            } else {
                "evalsha"
            });
            let cols: Vec<String> = inner.iter().map(|u| format!("{u:>7.3}")).collect();
            println!(
                "{:>5} {:>10} {:>9.3} {:>8.3} {} {:>7.3} {:>9.0}",
                round,
                v.name,
                cpu * 1e6 / points as f64,
                eval,
                cols.join(" "),
                eval - inner.iter().sum::<f64>(),
                rate
            );
        }
    }

    for v in &variants {
        let k = &v.keys;
        let _: () = redis::cmd("DEL")
            .arg(&k.live)
            .arg(&k.seen)
            .arg(&k.order)
            .arg(&k.seq)
            .query(&mut c)
            .unwrap();
    }
}
