//! The operations map's refresh at 60,000 live couriers (docs/maps.md): the maps (web crate)
//! in this process over real Redis, and headless Chromium for the browser's side. Prints
//! figures; asserts nothing about speed.
//!
//! `cargo bench --bench maps` (or `./dev bench maps`). Settings (environment):
//! MAPS_BENCH_COURIERS (60000), MAPS_BENCH_REFRESHES (40 per view), MAPS_BENCH_SECONDS (8, the
//! browser's measuring window).
//!
//! Per view (whole city: clustered; district: at the 2,000-marker cap; street: a few hundred;
//! and 5,000 markers with `web.max_markers = 5000`): the process's CPU per refresh (the maps'
//! handler, axum, and this benchmark's own minimal HTTP client: an upper bound of the server's
//! share), Redis's CPU per refresh, the answer's bytes and its latency. Then the browser with
//! 5,000 markers in view while every courier moves each second: the time a refresh takes to
//! apply in the page, and the frame times (requestAnimationFrame intervals) meanwhile.

#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use courier_auth::Audience;
use courier_wire::Keys;
use std::time::{Duration, Instant};
use support::*;

/// The fleet's box: about 44 x 44 km around Riyadh.
const SOUTH: f64 = 24.5;
const WEST: f64 = 46.5;
const SPAN: f64 = 0.4;

fn pos(i: u64, t: u64) -> (f64, f64) {
    // A fixed scatter, drifting a little each second (every courier moves).
    let h = i.wrapping_mul(0x9E3779B97F4A7C15);
    let y = (h >> 40) as f64 / (1u64 << 24) as f64;
    let x = ((h >> 16) & 0xFF_FFFF) as f64 / (1u64 << 24) as f64;
    let d = (t as f64 * 0.00003) * if i % 2 == 0 { 1.0 } else { -1.0 };
    (SOUTH + y * SPAN + d, WEST + x * SPAN + d)
}

async fn fill(keys: &Keys, n: u64, t: u64) {
    let mut r = redis().await;
    let now = courier_wire::clock::unix_now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let mut p = redis::pipe();
        for &i in chunk {
            let (lat, lon) = pos(i, t);
            let id = format!("b{i:06}");
            p.cmd("GEOADD")
                .arg(&keys.live)
                .arg(lon)
                .arg(lat)
                .arg(&id)
                .ignore();
            // Ages spread over the eviction window: fresh, late and about to be evicted.
            p.cmd("ZADD")
                .arg(&keys.seen)
                .arg(now - (i % 60) as f64)
                .arg(&id)
                .ignore();
            if i % 50 == 0 {
                p.cmd("HSET")
                    .arg(&keys.order)
                    .arg(&id)
                    .arg(format!("o{i}"))
                    .ignore();
            }
        }
        let () = p.query_async(&mut r).await.unwrap();
    }
}

/// A view around the fleet's centre holding about `share` of its area.
fn view(share: f64) -> (f64, f64, f64, f64) {
    let side = SPAN * share.sqrt();
    let (clat, clon) = (SOUTH + SPAN / 2.0, WEST + SPAN / 2.0);
    (
        clon - side / 2.0,
        clat - side / 2.0,
        clon + side / 2.0,
        clat + side / 2.0,
    )
}

struct Figures {
    in_view: u64,
    markers: usize,
    clusters: usize,
    bytes: f64,
    cpu_ms: f64,
    redis_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn measure(maps: &RunningMaps, token: &str, bbox: (f64, f64, f64, f64), n: usize) -> Figures {
    // 20 columns: what a 1,280 px wide page asks for (one per 64 px).
    let path = format!(
        "/ops/api/live?bbox={},{},{},{}&cols=20",
        bbox.0, bbox.1, bbox.2, bbox.3
    );
    let first = http_get(maps.http, &path, Some(token)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let v = first.json();
    let redis_url = &services().redis_url;
    let (cpu0, redis0) = (
        common::cpu_seconds(std::process::id()),
        common::redis_cpu_seconds(redis_url),
    );
    let mut bytes = 0usize;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = http_get(maps.http, &path, Some(token)).await;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes += r.body.len();
    }
    let (cpu1, redis1) = (
        common::cpu_seconds(std::process::id()),
        common::redis_cpu_seconds(redis_url),
    );
    lat.sort_by(f64::total_cmp);
    Figures {
        in_view: v["in_view"].as_u64().unwrap(),
        markers: v["markers"].as_array().unwrap().len(),
        clusters: v["clusters"].as_array().unwrap().len(),
        bytes: bytes as f64 / n as f64,
        cpu_ms: (cpu1 - cpu0) * 1000.0 / n as f64,
        redis_ms: (redis1 - redis0) * 1000.0 / n as f64,
        p50_ms: lat[n / 2],
        p99_ms: lat[(n * 99 / 100).min(n - 1)],
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and a benchmark has no business inside the test suite (this one took a minute there).
    if !std::env::args().any(|a| a == "--bench") {
        println!("maps: benchmark skipped (run it with ./dev bench maps)");
        return;
    }
    let couriers: u64 = common::env_or("MAPS_BENCH_COURIERS", 60_000);
    let refreshes: usize = common::env_or("MAPS_BENCH_REFRESHES", 40);
    let seconds: u64 = common::env_or("MAPS_BENCH_SECONDS", 8);
    let keys = Keys::with_prefix(&prefix());
    fill(&keys, couriers, 0).await;
    let token = token_for(Audience::Ops, "bench", 3600);
    let ws = "ws://127.0.0.1:9/mqtt".to_string();
    let default = start_maps(keys.clone(), web::WebConfig::default(), ws.clone(), None).await;
    let five = start_maps(
        keys.clone(),
        web::WebConfig {
            max_markers: 5000,
            ..web::WebConfig::default()
        },
        ws,
        None,
    )
    .await;

    println!("maps: ops refresh at {couriers} live couriers ({refreshes} refreshes per view; process CPU includes the bench's HTTP client)");
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8}",
        "view", "in view", "markers", "clusters", "bytes", "cpu ms", "redis ms", "p50 ms", "p99 ms"
    );
    let fleet = 5000.0 / couriers as f64;
    for (name, maps, share) in [
        ("whole fleet (clustered)", &default, 1.0),
        (
            "district (~2,000, the default cap)",
            &default,
            1900.0 / couriers as f64,
        ),
        ("street (~200)", &default, 200.0 / couriers as f64),
        ("5,000 markers (max_markers 5000)", &five, fleet * 0.98),
    ] {
        let f = measure(maps, &token, view(share), refreshes).await;
        println!(
            "{:<34} {:>8} {:>8} {:>8} {:>10.0} {:>9.2} {:>9.2} {:>8.2} {:>8.2}",
            name,
            f.in_view,
            f.markers,
            f.clusters,
            f.bytes,
            f.cpu_ms,
            f.redis_ms,
            f.p50_ms,
            f.p99_ms
        );
    }

    // Why WITHHASH: the same whole-fleet GEOSEARCH with coordinates formatted by Redis.
    let mut r = redis().await;
    r.set_response_timeout(Duration::from_secs(10));
    let (lon, lat, w, h) = web::live::Bbox::parse(&format!(
        "{},{},{},{}",
        WEST,
        SOUTH,
        WEST + SPAN,
        SOUTH + SPAN
    ))
    .unwrap()
    .search_box();
    let mut per = Vec::new();
    for with in ["WITHHASH", "WITHCOORD"] {
        let c0 = common::redis_cpu_seconds(&services().redis_url);
        for _ in 0..refreshes {
            let v: redis::Value = redis::cmd("GEOSEARCH")
                .arg(&keys.live)
                .arg("FROMLONLAT")
                .arg(lon)
                .arg(lat)
                .arg("BYBOX")
                .arg(w)
                .arg(h)
                .arg("m")
                .arg(with)
                .arg("COUNT")
                .arg(100_000)
                .arg("ANY")
                .query_async(&mut r)
                .await
                .unwrap();
            drop(v);
        }
        per.push(
            (common::redis_cpu_seconds(&services().redis_url) - c0) * 1000.0 / refreshes as f64,
        );
    }
    println!(
        "GEOSEARCH of the whole fleet alone: WITHHASH {:.2} ms of Redis CPU, WITHCOORD {:.2} ms ({:.1}x)",
        per[0], per[1], per[1] / per[0]
    );

    // The browser: 5,000 markers in view, every courier moving each second.
    let browser = Browser::start().await;
    // A square window and no zoom snapping, so the view is the measured 5,000-courier box.
    let tab = browser.tab(1000, 1000).await;
    tab.goto(&five.url(&format!("/ops?token={token}"))).await;
    assert!(
        tab.wait_for(
            "window.opsMap && opsMap.refreshes >= 1",
            Duration::from_secs(20)
        )
        .await
    );
    let (w, s, e, n) = view(fleet * 0.98);
    tab.eval(&format!("opsMap.map.options.zoomSnap = 0; opsMap.map.fitBounds([[{s}, {w}], [{n}, {e}]], {{animate: false}}); true"))
        .await;
    // Zoom until about 5,000 couriers are in view (the window's shape decides the area).
    for _ in 0..8 {
        let before = tab.eval("opsMap.refreshes").await.as_u64().unwrap();
        assert!(
            tab.wait_for(
                &format!("opsMap.refreshes > {before}"),
                Duration::from_secs(20)
            )
            .await,
            "the page stopped refreshing"
        );
        let in_view = tab.eval("opsMap.inView").await.as_f64().unwrap();
        if (4700.0..=5000.0).contains(&in_view) {
            break;
        }
        let dz = (in_view / 4850.0).log2() / 2.0;
        tab.eval(&format!(
            "opsMap.map.setZoom(opsMap.map.getZoom() + {dz}, {{animate: false}}); true"
        ))
        .await;
    }
    assert!(
        tab.wait_for("opsMap.markers.size > 4000", Duration::from_secs(20)).await,
        "the page did not draw the markers: {}",
        tab.eval("JSON.stringify([opsMap.markers.size, opsMap.refreshes, document.getElementById('view').textContent, document.getElementById('updated').textContent, opsMap.map.getBounds().toBBoxString()])").await
    );
    let mover = {
        let keys = keys.clone();
        tokio::spawn(async move {
            for t in 1.. {
                fill(&keys, couriers, t).await;
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        })
    };
    let r = tab
        .eval(&format!(
            "new Promise((done) => {{ const frames = []; const applies = []; let last = performance.now(); \
             let seen = opsMap.refreshes; const t0 = last; \
             const f = (t) => {{ frames.push(t - last); last = t; \
               if (opsMap.refreshes !== seen) {{ seen = opsMap.refreshes; applies.push(opsMap.lastApplyMs); }} \
               if (t - t0 < {ms}) requestAnimationFrame(f); else done({{ frames, applies, markers: opsMap.markers.size }}); }}; \
             requestAnimationFrame(f); }})",
            ms = seconds * 1000
        ))
        .await;
    mover.abort();
    let mut frames: Vec<f64> = r["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_f64())
        .collect();
    frames.remove(0);
    frames.sort_by(f64::total_cmp);
    let mut applies: Vec<f64> = r["applies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_f64())
        .collect();
    applies.sort_by(f64::total_cmp);
    let q = |v: &[f64], p: f64| {
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "browser (headless chromium, software rendering): {} markers in view, {} frames in {seconds} s: frame time p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        r["markers"], frames.len(), q(&frames, 0.5), q(&frames, 0.95), q(&frames, 0.99), frames.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "browser: applying one refresh (5,000 markers moved, restyled, canvas redraw queued): p50 {:.1} ms, max {:.1} ms over {} refreshes",
        q(&applies, 0.5), applies.last().copied().unwrap_or(f64::NAN), applies.len()
    );
    if std::env::var_os("MAPS_SCREENSHOTS").is_some() {
        tab.call("Emulation.setDeviceMetricsOverride", serde_json::json!({ "width": 820, "height": 520, "deviceScaleFactor": 1, "mobile": false })).await;
        tab.eval("opsMap.map.invalidateSize(); opsMap.map.setZoom(opsMap.map.getZoom() - 1.5, {animate: false}); true").await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        tab.screenshot(&repo_root().join("docs").join("ops-map-clusters.png"))
            .await;
    }
    drop(browser);
    default.stop();
    five.stop();
    cleanup(&keys).await;
}
