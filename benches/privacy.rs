//! Issue 17's figures: what the anonymous aggregates cost per million points, and how long
//! erasing a courier with 30 days of points every 4 s (648,000 rows) takes. Rows are made by
//! SQL `generate_series` in a fresh schema (dropped after). Prints figures; asserts nothing
//! about speed.
//!
//! `./dev bench privacy` (or `cargo bench --bench privacy`). Knobs: PRIVACY_BENCH_COURIERS
//! (couriers in the aggregated hour, each a point every 4 s: 1,112 is 1,000,800 points),
//! PRIVACY_BENCH_ROUNDS (default 3), PRIVACY_BENCH_OTHERS (other couriers with the same 30 days
//! beside the erased one, default 4).

#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use common::env_or;
use courier_auth::Audience;
use courier_wire::Keys;
use history_writer::aggregates::{self, RunSettings};
use history_writer::partitions::{self, day_of};
use history_writer::Erasure;
use std::time::{Duration, Instant};
use support::*;

/// 2026-11-30 00:00:00Z
const NOV30: f64 = 1_795_996_800.0;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("privacy: a benchmark; run it with `cargo bench --bench privacy`");
        return;
    }
    let couriers: i64 = env_or("PRIVACY_BENCH_COURIERS", 1112);
    let rounds: u32 = env_or("PRIVACY_BENCH_ROUNDS", 3);
    let others: i64 = env_or("PRIVACY_BENCH_OTHERS", 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        aggregation(couriers, rounds).await;
        erasure(others, rounds).await;
    });
}

async fn aggregation(couriers: i64, rounds: u32) {
    let s = pg_schema().await;
    let mut c = pg_connect(&s.url).await;
    history_writer::migrate(&mut c).await.unwrap();
    partitions::ensure_days(&mut c, &[day_of(NOV30)])
        .await
        .unwrap();
    let hour = NOV30 + 10.0 * 3600.0;
    // Couriers in groups of five riding side by side (so that cells reach k), the groups on a
    // grid over Riyadh (40 rows 0.008 degrees apart, columns 0.01 apart), moving north-east.
    let t = Instant::now();
    c.execute(
        "INSERT INTO courier_points (courier_id, seq, phone_ts, received_at, order_id, lat, lon) \
         SELECT 'c' || k, n + 1, to_timestamp($1::float8 + n * 4 + k % 4), to_timestamp($1::float8 + n * 4 + k % 4 + 0.3), \
                CASE WHEN k % 3 = 0 THEN 'o' || k END, \
                24.55 + ((k / 5) % 40) * 0.008 + (k % 5) * 0.0002 + n * 0.00002, \
                46.55 + (k / 200) * 0.01 + n * 0.00001 \
         FROM generate_series(0, $2::int8 - 1) k, generate_series(0, 899) n",
        &[&hour, &couriers],
    )
    .await
    .unwrap();
    c.batch_execute("ANALYZE courier_points").await.unwrap();
    let points = couriers * 900;
    println!(
        "aggregation: {points} points of {couriers} couriers in one hour (generated in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let settings = RunSettings {
        min_couriers: 5,
        delay: Duration::from_secs(600),
        retention_days: 730,
        max_hours: 1,
    };
    for r in 1..=rounds {
        c.execute(
            "INSERT INTO aggregate_watermark (done_until) VALUES (to_timestamp($1)) \
             ON CONFLICT (singleton) DO UPDATE SET done_until = excluded.done_until",
            &[&hour],
        )
        .await
        .unwrap();
        let t = Instant::now();
        let out = aggregates::run_pending(&mut c, hour + 7200.0, &settings)
            .await
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(out.hours, 1);
        println!(
            "  round {r}: {:.2} s for the hour ({} cell-hours written), {:.2} s per million points",
            secs,
            out.cells,
            secs * 1e6 / points as f64
        );
    }
    // The alternative: the points brought to this process to compute in Rust (the `geo`
    // crate's haversine and a sort per cell). Only the read is timed: it alone is the bar.
    let t = Instant::now();
    let rows = c
        .query(
            "SELECT courier_id, seq, phone_ts, lat, lon FROM courier_points \
             WHERE received_at >= to_timestamp($1::float8) AND received_at < to_timestamp($1::float8 + 3600)",
            &[&hour],
        )
        .await
        .unwrap();
    println!(
        "  for comparison: reading the hour's {} points into this process takes {:.2} s, before any computing",
        rows.len(),
        t.elapsed().as_secs_f64()
    );
    s.drop().await;
}

async fn erasure(others: i64, rounds: u32) {
    let per_courier: i64 = 30 * 86_400 / 4;
    for r in 1..=rounds {
        let s = pg_schema().await;
        let mut c = pg_connect(&s.url).await;
        history_writer::migrate(&mut c).await.unwrap();
        let now = courier_wire::clock::unix_now();
        let start = now - 30.0 * 86_400.0;
        let days: Vec<i64> = (day_of(start)..=day_of(now)).collect();
        partitions::ensure_days(&mut c, &days).await.unwrap();
        let t = Instant::now();
        // The erased courier is k = 0; the others share his 30 days, interleaved as in life.
        c.execute(
            "INSERT INTO courier_points (courier_id, seq, phone_ts, received_at, order_id, lat, lon) \
             SELECT 'c' || k, n + 1, to_timestamp($1::float8 + n * 4), to_timestamp($1::float8 + n * 4 + 0.3), NULL, \
                    24.7 + (n % 1000) * 0.00001, 46.6 + k * 0.001 \
             FROM generate_series(0, $2::int8 - 1) n, generate_series(0, $3::int8) k",
            &[&start, &per_courier, &others],
        )
        .await
        .unwrap();
        c.batch_execute("ANALYZE courier_points").await.unwrap();
        let total = per_courier * (others + 1);
        let keys = Keys::with_prefix(&prefix());
        let api = Erasure::new(
            &s.url,
            &services().redis(),
            keys.clone(),
            test_verifier(Audience::Privacy),
            history_writer::system_clock(),
        )
        .unwrap();
        let gen = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (removed, _) = api.erase("bench", "c0", "benchmark").await.unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(removed.postgres_points as i64, per_courier);
        println!(
            "erasure round {r}: {} rows of one courier over {} partitions, among {total} rows (generated in {gen:.1} s): erased in {secs:.2} s ({:.1} µs a row)",
            removed.postgres_points,
            days.len(),
            secs * 1e6 / per_courier as f64
        );
        s.drop().await;
    }
}
