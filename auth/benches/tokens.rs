//! What a login costs: verifying a device token is the edge's CPU per CONNECT, so a reconnect
//! storm of 60,000 phones costs 60,000 of these.
//!
//! Run: `cargo bench -p courier-auth --bench tokens`
//!
//! Measured on the 2-core dev box, one run (2026-12-01, another build running): sign 34 µs,
//! verify 36 µs (Ed25519 through ring; the HMAC tokens before cost about 1 µs), refuse an
//! unknown kid 0.3 µs. 60,000 phones reconnecting at once: about 2.2 s of one core.

use courier_auth::{Audience, Claims, SigningKey, Verifier};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

fn tokens(c: &mut Criterion) {
    let key = SigningKey::generate(Audience::Courier).unwrap();
    let verifier = Verifier::new(Audience::Courier, [key.public().clone()]).unwrap();
    let claims = Claims::courier("c00042", 1_764_460_800, 30 * 86_400);
    let token = key.sign(&claims);
    c.bench_function("sign a device token", |b| {
        b.iter(|| key.sign(black_box(&claims)))
    });
    c.bench_function("verify a device token", |b| {
        b.iter(|| verifier.verify(black_box(&token), 1_764_460_900).unwrap())
    });
    // Another key's token carries that key's kid: refused before any signature check.
    let other = SigningKey::generate(Audience::Courier)
        .unwrap()
        .sign(&claims);
    c.bench_function("refuse a token of an unknown kid", |b| {
        b.iter(|| verifier.verify(black_box(&other), 1_764_460_900).is_err())
    });
}

criterion_group!(benches, tokens);
criterion_main!(benches);
