//! The history path from MQTT to committed rows: publishers -> embedded rumqttd -> history
//! writer (one process) -> PostgreSQL binary COPY, at a fixed offered rate for a fixed time.
//! Prints figures; asserts nothing about speed. Each run uses a fresh schema (dropped after).
//!
//! `cargo bench --bench history_path` (DATABASE_URL / REDIS_URL from the environment, else
//! `./dev services env`). Knobs: HISTORY_BENCH_RATE (points/s, default 100000),
//! HISTORY_BENCH_SECONDS (default 20), HISTORY_BENCH_PUBLISHERS (default 4),
//! HISTORY_BENCH_CLIENTS (writer MQTT clients, default 1), HISTORY_BENCH_WRITERS (COPY
//! connections, default 2).

#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use common::env_or;
use courier_wire::{loc_topic, Keys, Validation};
use history_writer::{HistoryConfig, HistoryWriter, Stats};
use rumqttc::QoS;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio_util::sync::CancellationToken;

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a 20 s load run does not belong in the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        println!("history_path: a benchmark; run it with `cargo bench --bench history_path`");
        return;
    }
    let rate: u64 = env_or("HISTORY_BENCH_RATE", 100_000);
    let seconds: u64 = env_or("HISTORY_BENCH_SECONDS", 20);
    let publishers: u64 = env_or("HISTORY_BENCH_PUBLISHERS", 4);
    let clients: usize = env_or("HISTORY_BENCH_CLIENTS", 1);
    let writers: usize = env_or("HISTORY_BENCH_WRITERS", 2);
    let couriers: u64 = 10_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let broker = start_broker(BrokerKind::Embedded);
        let schema = pg_schema().await;
        let stats = Arc::new(Stats::default());
        let shutdown = CancellationToken::new();
        let writer = HistoryWriter {
            config: HistoryConfig { mqtt_clients: clients, writers, ..Default::default() },
            mqtt: broker.endpoint.clone(),
            database_url: schema.url.clone(),
            redis: services().redis(),
            keys: Keys::with_prefix(&prefix()),
            validation: Validation::default(),
            stats: stats.clone(),
            clock: history_writer::system_clock(),
        };
        let task = tokio::spawn(writer.run(shutdown.clone()));
        let st = stats.clone();
        assert!(wait_until(Duration::from_secs(15), || st.subscriptions_acked.load(Relaxed) >= clients as u64).await);
        println!(
            "history_path: offering {rate} points/s for {seconds}s from {couriers} couriers over {publishers} publishers; writer MQTT clients {clients}, COPY connections {writers}; RSS before {} MiB",
            common::status_kib(std::process::id(), "VmRSS:") / 1024
        );

        let sent = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let mut pubs = Vec::new();
        for p in 0..publishers {
            let (c, _h) = client(&broker.endpoint, None).await;
            let (sent, stop) = (sent.clone(), stop.clone());
            let per_tick = (rate / publishers / 100).max(1); // 10 ms ticks
            pubs.push(tokio::spawn(async move {
                let _keep = _h;
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut n: u64 = 0;
                while !stop.is_cancelled() {
                    tick.tick().await;
                    let ts = courier_wire::clock::unix_now();
                    for _ in 0..per_tick {
                        let courier = p + publishers * (n % (couriers / publishers));
                        let seq = n / (couriers / publishers) + 1;
                        let id = format!("c{courier:05}");
                        let payload = point(&id, 24.6 + (n % 1000) as f64 * 1e-4, 46.6 + (n % 777) as f64 * 1e-4, ts, seq);
                        if c.publish(loc_topic(&id), QoS::AtMostOnce, false, payload).await.is_err() {
                            return;
                        }
                        n += 1;
                    }
                    sent.fetch_add(per_tick, Relaxed);
                }
            }));
        }

        let started = Instant::now();
        let mut last = (0u64, 0u64, 0u64);
        let mut steady: Option<(Instant, u64)> = None;
        let mut peak_depth = 0;
        for s in 1..=seconds {
            tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
            let now = (sent.load(Relaxed), st.received.load(Relaxed), st.written.load(Relaxed));
            let depth = st.buffer_depth.load(Relaxed);
            peak_depth = peak_depth.max(depth);
            println!(
                "  t={s:>3}s sent {:>7}/s received {:>7}/s written {:>7}/s | buffer {depth:>7} | dropped {} | RSS {} MiB",
                now.0 - last.0,
                now.1 - last.1,
                now.2 - last.2,
                st.dropped_total(),
                common::status_kib(std::process::id(), "VmRSS:") / 1024
            );
            if s == 5 {
                // Measure from here: connection set-up and the first partitions are behind us.
                steady = Some((Instant::now(), now.2));
                st.commit_lag.reset();
            }
            last = now;
        }
        stop.cancel();
        for p in pubs {
            let _ = p.await;
        }
        let (t_steady, w_steady) = steady.unwrap_or((started, 0));
        let steady_secs = t_steady.elapsed().as_secs_f64();
        let written_steady = st.written.load(Relaxed) - w_steady;
        let p50 = st.commit_lag.quantile(0.5);
        let p99 = st.commit_lag.quantile(0.99);
        let rss = common::status_kib(std::process::id(), "VmRSS:") / 1024;
        let hwm = common::status_kib(std::process::id(), "VmHWM:") / 1024;
        // Let the broker deliver what is still on its way (until nothing new arrives for 1 s),
        // then the last batches commit; then account for everything.
        let mut seen = st.received.load(Relaxed);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = st.received.load(Relaxed);
            if now == seen {
                break;
            }
            seen = now;
        }
        let received = st.received.load(Relaxed);
        wait_until(Duration::from_secs(15), || st.written.load(Relaxed) + st.dropped_total() + st.invalid.load(Relaxed) >= received).await;
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
        let db = pg_connect(&schema.url).await;
        let in_table: i64 = db.query_one("SELECT count(*) FROM courier_points", &[]).await.unwrap().get(0);
        let sent = sent.load(Relaxed);
        println!(
            "history_path: sustained {:.0} rows/s committed (t=5s..{seconds}s); commit lag p50 {:.0} ms, p99 {:.0} ms (bucket upper bounds); RSS {rss} MiB now, peak {hwm} MiB (broker, publishers and writer in one process); peak buffer {peak_depth} rows",
            written_steady as f64 / steady_secs,
            p50 * 1e3,
            p99 * 1e3,
        );
        let batches = st.batches.load(Relaxed).max(1);
        println!(
            "history_path: {batches} COPYs, mean {:.0} rows and {:.1} ms each",
            st.written.load(Relaxed) as f64 / batches as f64,
            st.copy_micros.load(Relaxed) as f64 / batches as f64 / 1e3
        );
        println!(
            "history_path: sent {sent}, received {}, written {}, dropped {}, invalid {}, rows in table {in_table}, broker loss alerts {}",
            st.received.load(Relaxed),
            st.written.load(Relaxed),
            st.dropped_total(),
            st.invalid.load(Relaxed),
            courier_pipeline::broker::CURSOR_JUMPS.load(Relaxed)
        );
        schema.drop().await;
    });
}
