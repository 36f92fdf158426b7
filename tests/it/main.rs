//! The integration tests, one binary with a module per part of the pipeline: one link and one
//! build of the support code instead of one per file (sixteen binaries of about 240 MB each took
//! most of the suite's link time on 2 cores). Every test starts real services through
//! `support` (the helpers `./dev` uses) and isolates itself (random ids, fresh key prefixes and
//! schemas, port 0), so tests of different modules run side by side as those of one file did.
//!
//! Run one part with a filter: `cargo test --test it faults::`, `cargo test --test it cli::`.

#[path = "../../benches/common/mod.rs"]
mod common;
mod support;

mod broker_security;
mod cli;
mod cluster;
mod compose;
mod dashboard;
mod dispatch;
mod edge_security;
mod fanout;
mod faults;
mod history;
mod live_path;
mod maps;
mod mosquitto_acl;
mod notify;
mod privacy;
mod simulator;
