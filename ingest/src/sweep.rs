//! Periodic upkeep, safe to run in every worker process at once: silent couriers leave the
//! live index, and seq state of couriers gone for long is forgotten.

use crate::config::IngestConfig;
use crate::events::{Metrics, Stats};
use crate::sink::RedisSink;
use courier_wire::clock::unix_now;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

const EVICT_LIMIT: usize = 1000;
const FORGET_COUNT: usize = 1000;

pub(crate) async fn run(
    config: IngestConfig,
    sink: RedisSink,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.sweep_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut cursor = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = unix_now();
        let cutoff = now - config.evict_after.as_secs_f64();
        loop {
            match sink.evict(cutoff, EVICT_LIMIT).await {
                Ok((n, examined)) => {
                    stats.redis_up.set(true);
                    if n > 0 {
                        metrics.evicted_silent(&stats, n);
                        tracing::debug!(couriers = n, "evicted silent couriers");
                    }
                    if examined < EVICT_LIMIT as u64 {
                        break;
                    }
                }
                Err(e) => {
                    stats.redis_up.set(false);
                    tracing::warn!(error = %e, "eviction sweep failed; next tick retries");
                    break;
                }
            }
        }
        // One slice of the seq hash per tick: a full pass takes (couriers / 1000) ticks.
        match sink
            .forget(
                cursor,
                now - config.seq_forget_after.as_secs_f64(),
                FORGET_COUNT,
            )
            .await
        {
            Ok((next, removed)) => {
                cursor = next;
                if removed > 0 {
                    tracing::debug!(couriers = removed, "forgot seq state");
                }
            }
            Err(e) => tracing::warn!(error = %e, "seq state sweep failed; next tick retries"),
        }
    }
}
