//! The `courier:order` snapshot: the whole HASH read once per `order_refresh` (at most 1 s),
//! so a row's order is at most that stale and the receive loop reads it without I/O. One
//! HGETALL a second costs O(couriers carrying an order), a few thousand fields here.
//! While Redis is unreachable the last snapshot stays in use (logged once per outage).

use crate::Shared;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(crate) async fn refresh(
    redis_url: String,
    key: String,
    every: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let client = match redis::Client::open(redis_url.as_str()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "REDIS_URL unusable; rows get no order id");
            return;
        }
    };
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
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
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(Some(Duration::from_secs(1)));
                conn = Some(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                );
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
