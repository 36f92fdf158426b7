//! The server clock, as the wire format counts time: unix seconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
