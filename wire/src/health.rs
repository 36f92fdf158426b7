//! Readiness flags: each role marks whether its connections work, and `/readyz` reads them.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Whether one dependency (broker, Redis, PostgreSQL) answered the last time it was used.
#[derive(Debug, Default)]
pub struct Up(AtomicBool);

impl Up {
    pub fn set(&self, up: bool) {
        self.0.store(up, Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Relaxed)
    }
}
