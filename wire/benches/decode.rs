//! serde_json against simd-json on the real 85-byte point payload.
//!
//! Run: `cargo bench -p courier-wire --features simd-bench --bench decode`
//!
//! Measured on the 2-core dev box, one run (2026-11-30, machine otherwise quiet):
//!   serde_json, owned struct                 200 ns
//!   simd-json, owned struct, reused buffers  248 ns
//!   simd-json, owned struct, fresh buffers   383 ns
//!   production decode_point (serde_json, borrowed id, float_roundtrip, validation)  235 ns
//! serde_json stays: faster than simd-json on an 85-byte payload, and no extra dependency.

use courier_wire::{decode_point, Validation};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde::Deserialize;
use std::hint::black_box;

const PAYLOAD: &[u8] =
    br#"{"id":"c00042","lat":24.713612,"lon":46.675301,"ts":1764460800.25,"seq":1842}"#;
const NOW: f64 = 1_764_460_801.0;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Owned {
    id: String,
    lat: f64,
    lon: f64,
    ts: f64,
    seq: u64,
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_point");
    g.throughput(Throughput::Elements(1));
    let limits = Validation::default();
    g.bench_function("serde_json+validate (production)", |b| {
        b.iter(|| decode_point("c00042", black_box(PAYLOAD), NOW, &limits).unwrap())
    });
    g.bench_function("serde_json owned struct", |b| {
        b.iter(|| serde_json::from_slice::<Owned>(black_box(PAYLOAD)).unwrap())
    });
    let mut buffers = simd_json::Buffers::default();
    let mut scratch = Vec::with_capacity(128);
    g.bench_function("simd-json owned struct, reused buffers", |b| {
        b.iter(|| {
            scratch.clear();
            scratch.extend_from_slice(black_box(PAYLOAD));
            simd_json::serde::from_slice_with_buffers::<Owned>(&mut scratch, &mut buffers).unwrap()
        })
    });
    g.bench_function("simd-json owned struct, fresh buffers", |b| {
        b.iter(|| {
            let mut v = black_box(PAYLOAD).to_vec();
            simd_json::serde::from_slice::<Owned>(&mut v).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
