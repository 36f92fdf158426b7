//! The `courier:order` snapshot: the whole HASH read once per `order_refresh` (at most 1 s),
//! so a row's order is at most that stale and the receive loop reads it without I/O. One
//! HGETALL a second costs O(couriers carrying an order), a few thousand fields here.
//! While Redis is unreachable the last snapshot stays in use (logged once per outage).

use crate::Shared;
use courier_wire::{RedisConn, RedisOptions, RedisTarget};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(crate) async fn refresh(
    target: RedisTarget,
    key: String,
    every: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    // One second at most per try: the snapshot is refreshed every `every`, and a slow Redis
    // must not hold the loop (the last snapshot stays in use meanwhile).
    let options = RedisOptions {
        connection_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(1),
        retries: 1,
    };
    let mut conn: Option<RedisConn> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = async {
            if conn.is_none() {
                conn = Some(RedisConn::connect(&target, &options).await?);
            }
            let c = conn.as_mut().expect("connected above");
            let map: HashMap<String, String> =
                redis::cmd("HGETALL").arg(&key).query_async(c).await?;
            Ok::<_, redis::RedisError>(map)
        }
        .await;
        match result {
            Ok(map) => {
                if failing {
                    tracing::info!("courier:order readable again");
                    failing = false;
                }
                // Couriers carrying the same order share one allocation of its id.
                let mut ids: HashMap<String, Arc<str>> = HashMap::new();
                let orders = map
                    .into_iter()
                    .map(|(courier, order)| {
                        let id = ids
                            .entry(order)
                            .or_insert_with_key(|o| Arc::from(o.as_str()))
                            .clone();
                        (courier, id)
                    })
                    .collect();
                shared.set_orders(orders);
            }
            Err(e) => {
                conn = None;
                if !failing {
                    tracing::warn!(error = %e, "cannot read courier:order; rows keep the last known orders until it is back");
                    failing = true;
                }
            }
        }
    }
}
