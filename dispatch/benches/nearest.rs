//! Searches per second and p99 of the dispatch query, in the two shapes of the reference
//! article: 16,000 couriers spread over Riyadh, and 20,000 standing on one point (every GPS
//! reporting the same default location), each with and without ANY.
//!
//!   REDIS_URL=redis://127.0.0.1:6390/ cargo bench -p dispatch --bench nearest
//!   (./dev bench dispatch sets REDIS_URL)
//! Keys live under a fresh prefix and are deleted afterwards. `cargo test` runs nothing here.

use courier_wire::Keys;
use dispatch::{bench, Dispatch, Query};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::time::Duration;

const RIYADH: ((f64, f64), (f64, f64)) = ((24.60, 24.85), (46.55, 46.85));
const HOT: (f64, f64) = (24.7114, 46.6744);

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let concurrency: usize = std::env::var("DISPATCH_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let searches: usize = std::env::var("DISPATCH_BENCH_SEARCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut rng = SmallRng::seed_from_u64(7);
        let now = courier_wire::clock::unix_now();
        println!("dispatch nearest: count 10, rings 0.5/1/2/5 km, max age 60 s, {concurrency} searches in flight on one connection");

        let spread: Vec<(String, f64, f64)> = (0..16_000)
            .map(|i| (format!("c{i:05}"), rng.random_range(RIYADH.0 .0..RIYADH.0 .1), rng.random_range(RIYADH.1 .0..RIYADH.1 .1)))
            .collect();
        let spread_q: Vec<Query> = (0..1000)
            .map(|_| {
                let mut q = Query::at(rng.random_range(RIYADH.0 .0..RIYADH.0 .1), rng.random_range(RIYADH.1 .0..RIYADH.1 .1));
                q.max_age = Duration::from_secs(60);
                q
            })
            .collect();
        let hot: Vec<(String, f64, f64)> = (0..20_000).map(|i| (format!("h{i:05}"), HOT.0, HOT.1)).collect();
        let mut hot_q = Query::at(HOT.0, HOT.1);
        hot_q.max_age = Duration::from_secs(60);

        for (label, couriers, queries, exact_searches) in [
            ("16,000 spread", spread, spread_q, searches),
            // Without ANY each search sorts all 20,000: a few thousand searches say enough.
            ("20,000 on one point", hot, vec![hot_q], (searches / 10).max(200)),
        ] {
            let keys = Keys::with_prefix(&format!("bench{:08x}:", rand::random::<u32>()));
            bench::seed(&url, &keys, &couriers, now).await.expect("seeding the live index");
            let d = Dispatch::connect(&courier_wire::RedisTarget::single(url.as_str()), keys.clone()).await.expect("redis");
            // Warm up (loads the script).
            bench::searches(&d, queries.clone(), 100, 4).await.expect("warm-up");
            let exact = bench::searches(&d, queries.clone(), exact_searches, concurrency).await.expect("search");
            println!("{}", exact.line(&format!("{label}, nearest (ASC)")));
            let any: Vec<Query> = queries.into_iter().map(|q| Query { any: true, ..q }).collect();
            let r = bench::searches(&d, any, searches, concurrency).await.expect("search");
            println!("{}", r.line(&format!("{label}, ANY")));
            bench::clear(&url, &keys).await.expect("cleanup");
        }
    });
}
