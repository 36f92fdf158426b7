//! Order events from the Redis stream to a webhook receiver: how many a second one notify
//! process records in the outbox and delivers, and what each costs. Events are written by a
//! Lua loop through the same `emit` the pipeline's scripts use (kinds in turn, distinct orders),
//! relayed, and POSTed signed to one local receiver (answering 204) subscribed to every kind.
//! Prints figures; asserts nothing about speed. A fresh schema and key prefix per run.
//!
//! `cargo bench --bench notify` (REDIS_URL / DATABASE_URL from the environment, else
//! `./dev services env`). Knobs: NOTIFY_BENCH_EVENTS (default 20000), NOTIFY_BENCH_CONCURRENCY
//! (attempts in flight, default 64).

#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use common::env_or;
use courier_wire::Keys;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio_util::sync::CancellationToken;

const EMIT_MANY: &str = "
for i = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[2]) + i
  local kinds = { 'order.assigned', 'order.picked_up', 'courier.arriving_dropoff', 'order.delivered' }
  local kind = kinds[(n % 4) + 1]
  emit(KEYS[1], KEYS[2], ARGV[3], kind, kind .. ':o' .. n, 'o' .. n, 'c' .. n, 'acme', ARGV[4])
end
return 1";

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("notify: a benchmark; run it with `cargo bench --bench notify`");
        return;
    }
    let events: u64 = env_or("NOTIFY_BENCH_EVENTS", 20_000);
    let concurrency: usize = env_or("NOTIFY_BENCH_CONCURRENCY", 64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let schema = pg_schema().await;
        let keys = Keys::with_prefix(&prefix());
        let received = Arc::new(AtomicU64::new(0));
        let r = received.clone();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hook = l.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Relaxed);
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });

        let stats = Arc::new(notify::Stats::default());
        let n = notify::Notify {
            config: notify::NotifyConfig {
                concurrency,
                poll_interval: Duration::from_millis(20),
                stream_max: events + 1,
                ..Default::default()
            },
            redis: services().redis(),
            database_url: schema.url.clone(),
            keys: keys.clone(),
            stats: stats.clone(),
        };
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api_addr = api.local_addr().unwrap();
        let router = n.router(TEST_SERVICE_KEY.into());
        tokio::spawn(async move { axum::serve(api, router).await.unwrap() });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(n.run(shutdown.clone()));
        let r = http_post(
            api_addr,
            "/webhooks/endpoints",
            &[("Authorization", &format!("Bearer {TEST_SERVICE_KEY}"))],
            &format!(
                r#"{{"tenant":"acme","url":"http://{hook}/hook","kinds":["order.assigned","order.picked_up","courier.arriving_dropoff","order.delivered"]}}"#
            ),
        )
        .await;
        assert_eq!(r.status, 201, "{r:?}");

        let me = std::process::id();
        let (cpu0, pg0, redis0) = (
            common::cpu_seconds(me),
            common::cpu_seconds_named("postgres"),
            common::redis_cpu_seconds(&services().redis_url),
        );
        let start = Instant::now();
        let script = redis::Script::new(&courier_wire::events::with_emit(EMIT_MANY));
        let mut c = redis().await;
        let per_call = 500u64;
        let mut written = 0;
        while written < events {
            let k = per_call.min(events - written);
            let _: i64 = script
                .key(&keys.events)
                .key(&keys.events_dropped)
                .arg(k)
                .arg(written)
                .arg(events + 1)
                .arg(courier_wire::clock::unix_now())
                .invoke_async(&mut c)
                .await
                .unwrap();
            written += k;
        }
        let emitted = start.elapsed();
        let s = stats.clone();
        assert!(
            wait_until(Duration::from_secs(600), || s.recorded.load(Relaxed) >= events).await,
            "recorded {} of {events}",
            stats.recorded.load(Relaxed)
        );
        let recorded = start.elapsed();
        let s = stats.clone();
        assert!(
            wait_until(Duration::from_secs(600), || s.delivered.load(Relaxed) >= events).await,
            "delivered {} of {events}",
            stats.delivered.load(Relaxed)
        );
        let delivered = start.elapsed();
        let cpu = common::cpu_seconds(me) - cpu0;
        let pg = common::cpu_seconds_named("postgres") - pg0;
        let redis_cpu = common::redis_cpu_seconds(&services().redis_url) - redis0;
        let per = |d: Duration| events as f64 / d.as_secs_f64();
        println!("notify: {events} events, one endpoint for every kind, {concurrency} attempts in flight");
        println!("  written to the stream   {:>9.0} events/s", per(emitted));
        println!("  recorded in the outbox  {:>9.0} events/s (from the first write)", per(recorded));
        println!("  delivered (204)         {:>9.0} events/s (from the first write), retried {}", per(delivered), stats.retried.load(Relaxed));
        println!(
            "  CPU per event: this process (relay, dispatcher, receiver, writer) {:.0} µs, PostgreSQL {:.0} µs, Redis {:.1} µs",
            cpu * 1e6 / events as f64,
            pg * 1e6 / events as f64,
            redis_cpu * 1e6 / events as f64
        );
        assert_eq!(received.load(Relaxed), events, "each event delivered once");
        shutdown.cancel();
        let _ = task.await;
        cleanup(&keys).await;
        schema.drop().await;
    });
}
