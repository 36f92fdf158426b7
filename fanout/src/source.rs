//! The two inputs of a gateway process.
//!
//! - Points: ONE MQTT subscription to `track/+` per process. The receive loop hands each point
//!   to the [`Hub`] (a lock and queue pushes, never I/O) and counts once per batch.
//! - Ended orders: a Redis pub/sub subscription to the channel every `delivered` is announced
//!   on, so the viewers of an ended order are closed in every gateway process, not only the
//!   one that served the API call. After each (re)subscription the watched orders are checked
//!   against `order:courier` once, so an announcement missed while disconnected still counts.

use crate::events::{Metrics, Stats, Tally};
use crate::hub::Hub;
use courier_wire::mqtt::{poll_ticking, Polled, Subscriber};
use courier_wire::{Keys, MqttEndpoint, RedisConn, RedisTarget};
use futures_util::StreamExt;
use rumqttc::AsyncClient;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The subscription of every gateway process.
pub(crate) const TRACK_FILTER: &str = "track/+";

/// Receives `track/+` until `stop`, then disconnects.
pub(crate) async fn tracks(
    endpoint: MqttEndpoint,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let opts =
        courier_wire::mqtt::options(&endpoint, &courier_wire::mqtt::client_id("fanout", 0), 10);
    let (client, mut eventloop) = AsyncClient::new(opts, 10);
    courier_wire::mqtt::no_delay(&mut eventloop);
    let sub = Subscriber::new("fanout", client, vec![TRACK_FILTER.to_string()]);
    let mut tally = Tally::default();
    let mut flush = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            ev = poll_ticking(&mut eventloop, &mut flush, || {
                metrics.source(&stats, &tally);
                tally = Tally::default();
            }) => match sub.handle(ev, &stats.mqtt_up) {
                Polled::Publish(p) => {
                    if let Some(order) = p.topic.strip_prefix("track/") {
                        if courier_wire::topic::valid_id(order) {
                            hub.dispatch(order, p.payload, Instant::now(), &mut tally);
                        }
                    }
                    if tally.tracks >= 1024 {
                        metrics.source(&stats, &tally);
                        tally = Tally::default();
                    }
                }
                Polled::Subscribed => {
                    stats.source_subscribed.fetch_add(1, Relaxed);
                }
                Polled::Failed(wait) => tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => break,
                },
                Polled::Other | Polled::Unsubscribed => {}
            }
        }
    }
    metrics.source(&stats, &tally);
    // Tracks that arrive while disconnecting have no viewer left to go to: the gateway closes
    // its sessions at the same stop.
    let _late_tracks = sub
        .disconnect(&mut eventloop, Duration::from_millis(300))
        .await;
}

/// Listens for ended orders until `stop`; reconnects after a failure.
pub(crate) async fn ended_orders(
    target: RedisTarget,
    conn: RedisConn,
    keys: Keys,
    hub: Arc<Hub>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    // Classic pub/sub: on a cluster a PUBLISH reaches every node, so a plain connection to any
    // seed hears it; after a failure the next seed is tried.
    let urls = target.urls();
    for attempt in 0.. {
        let url = &urls[attempt % urls.len()];
        let run = async {
            let client = redis::Client::open(url.as_str())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&keys.orders_ended_channel).await?;
            catch_up(conn.clone(), &keys, &hub, &stats).await?;
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let Ok(order) = msg.get_payload::<String>() else {
                    continue;
                };
                end_here(&hub, &stats, &order);
            }
            Ok::<(), redis::RedisError>(())
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            r = run => match r {
                Ok(()) => tracing::warn!("ended-orders subscription closed; resubscribing in 1s"),
                Err(e) => tracing::warn!(error = %e, "ended-orders subscription failed; retrying in 1s"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Ends, in this process, the watched orders that no longer run.
async fn catch_up(
    mut conn: RedisConn,
    keys: &Keys,
    hub: &Hub,
    stats: &Stats,
) -> redis::RedisResult<()> {
    let watched = hub.watched_orders();
    if watched.is_empty() {
        return Ok(());
    }
    let couriers: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&keys.order_courier)
        .arg(&watched)
        .query_async(&mut conn)
        .await?;
    for (order, courier) in watched.iter().zip(couriers) {
        if courier.is_none() {
            end_here(hub, stats, order);
        }
    }
    Ok(())
}

pub(crate) fn end_here(hub: &Hub, stats: &Stats, order: &str) {
    if let Some(kicked) = hub.end(order, Instant::now()) {
        stats.orders_ended.fetch_add(1, Relaxed);
        tracing::info!(viewers = kicked, "order ended; its viewers are closed");
    }
}
