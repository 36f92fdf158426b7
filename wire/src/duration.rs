//! `Duration` settings written as humantime strings (`"60s"`, `"1h 30m"`), for
//! `#[serde(with = "courier_wire::duration")]`.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(serde::de::Error::custom)
}
