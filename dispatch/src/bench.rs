//! Measuring the query: seeding a live index of a given shape, and running searches from
//! many tasks at once on one multiplexed connection. Used by `cargo bench -p dispatch` and
//! `courier-pipeline nearest --bench N`.

use crate::{Dispatch, DispatchError, Query};
use courier_wire::Keys;
use std::sync::Arc;
use std::time::Instant;

/// What a run of searches measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    pub searches: usize,
    pub seconds: f64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Mean couriers returned per search.
    pub found_mean: f64,
}

impl BenchResult {
    pub fn line(&self, label: &str) -> String {
        format!(
            "{label}: {} searches in {:.2}s = {:.0}/s, p50 {:.3} ms, p99 {:.3} ms, {:.1} couriers each",
            self.searches, self.seconds, self.per_second, self.p50_ms, self.p99_ms, self.found_mean
        )
    }
}

/// Runs `total` searches, cycling through `queries`, from `concurrency` tasks.
pub async fn searches(
    d: &Dispatch,
    queries: Vec<Query>,
    total: usize,
    concurrency: usize,
) -> Result<BenchResult, DispatchError> {
    let queries = Arc::new(queries);
    let concurrency = concurrency.max(1);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (d, queries) = (d.clone(), queries.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut found = 0usize;
            let mut i = t;
            while i < total {
                let q = &queries[i % queries.len()];
                let t0 = Instant::now();
                let n = d.nearest(q, courier_wire::clock::unix_now()).await?;
                lat.push(t0.elapsed().as_secs_f64());
                found += n.couriers.len();
                i += concurrency;
            }
            Ok::<_, DispatchError>((lat, found))
        }));
    }
    let mut all = Vec::with_capacity(total);
    let mut found = 0;
    for t in tasks {
        let (lat, f) = t
            .await
            .map_err(|e| DispatchError::Query(format!("bench task: {e}")))??;
        all.extend(lat);
        found += f;
    }
    let seconds = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let q = |p: f64| {
        all.get(((p * all.len() as f64).ceil() as usize).max(1) - 1)
            .copied()
            .unwrap_or(0.0)
            * 1000.0
    };
    Ok(BenchResult {
        searches: all.len(),
        seconds,
        per_second: all.len() as f64 / seconds.max(1e-9),
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        found_mean: found as f64 / all.len().max(1) as f64,
    })
}

/// Writes couriers into the live index as ingest would: GEOADD `live` and ZADD `seen` with
/// `seen` as the time of the last point.
pub async fn seed(
    url: &str,
    keys: &Keys,
    couriers: &[(String, f64, f64)],
    seen: f64,
) -> Result<(), DispatchError> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for chunk in couriers.chunks(1000) {
        let mut p = redis::pipe();
        let geo = p.cmd("GEOADD").arg(&keys.live);
        for (id, lat, lon) in chunk {
            geo.arg(*lon).arg(*lat).arg(id);
        }
        let z = p.ignore().cmd("ZADD").arg(&keys.seen);
        for (id, _, _) in chunk {
            z.arg(seen).arg(id);
        }
        let _: () = p.ignore().query_async(&mut c).await?;
    }
    Ok(())
}

/// Removes the live index of `keys` (benchmarks and tests use their own prefix).
pub async fn clear(url: &str, keys: &Keys) -> Result<(), DispatchError> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("DEL")
        .arg(&keys.live)
        .arg(&keys.seen)
        .query_async(&mut c)
        .await?;
    Ok(())
}
