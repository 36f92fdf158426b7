//! Settings of the ingest role (`[ingest]` in the config file).

use courier_wire::ConfigError;
use serde::Deserialize;
use std::time::Duration;

/// Ingest settings as read from the file, with defaults for everything.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Shared-subscription group of the point stream (`$share/<group>/couriers/+/loc`). `""`: a
    /// plain subscription (one worker takes every point), for a node where this process is the
    /// only ingest: rumqttd then forwards points in runs instead of one per router pass.
    pub group: String,
    /// Group of the status stream (`""`: plain). A group of its own: two filters under one group
    /// name lose half the messages on rumqttd.
    pub status_group: String,
    /// Ingest workers in this process, each its own MQTT client in the group (1 without a group).
    pub workers: usize,
    /// Messages waiting between the MQTT receive loop and the Redis writer. When full, new
    /// messages are dropped and counted (`ingest_queue_dropped_total`), never awaited in the
    /// receive loop. About 200 B each.
    pub queue_capacity: usize,
    /// Most points per batch script call.
    pub batch_max: usize,
    /// Batch script calls in flight per worker.
    pub max_in_flight: usize,
    /// Under load (at least 16 messages queued when a batch starts) a batch short of
    /// `batch_max` waits this long for more before it goes: fuller batches, less Redis work per
    /// point, at most this much more delay. Under lighter load a batch goes at once. `0s` turns
    /// it off; at most 50ms.
    #[serde(with = "courier_wire::duration")]
    pub batch_linger: Duration,
    /// A courier silent this long leaves `couriers:live` (humantime: `60s`, `2m`).
    #[serde(with = "courier_wire::duration")]
    pub evict_after: Duration,
    /// `couriers:seen` is written for a courier only when his last accepted point falls into
    /// a new bucket of this length (0s: every point), which saves most of its ZADDs (couriers
    /// send every 1-4 s; at 20 s about one point in ten writes it). The score then lags the
    /// true last-seen time (kept in his seq state) by less than this; the eviction sweep
    /// confirms against that time, so eviction stays exact. Below `evict_after`; with
    /// `evict_after` minus a standing courier's heartbeat above it, a courier still sending is
    /// never an eviction candidate.
    #[serde(with = "courier_wire::duration")]
    pub seen_every: Duration,
    /// How often the eviction sweep runs.
    #[serde(with = "courier_wire::duration")]
    pub sweep_every: Duration,
    /// A lower seq with a newer phone time is taken as an app reinstall (seq restarted) once no
    /// point of that courier was accepted for this long.
    #[serde(with = "courier_wire::duration")]
    pub seq_reset_after: Duration,
    /// Seq state of a courier silent this long is forgotten (Redis memory bound).
    #[serde(with = "courier_wire::duration")]
    pub seq_forget_after: Duration,
    /// Largest accepted payload, bytes.
    pub max_payload_bytes: usize,
    /// How far the phone clock may run ahead of the server's.
    #[serde(with = "courier_wire::duration")]
    pub max_future_skew: Duration,
    /// How long a batch is retried while Redis is unreachable before its points are counted
    /// as `result="error"`. At most 20 s: the batch script keeps a batch's verdicts 30 s for
    /// its retries.
    #[serde(with = "courier_wire::duration")]
    pub redis_retry_for: Duration,
    /// Arrival radius around an order's pickup and drop-off places, metres
    /// (`courier.arriving_pickup` / `_dropoff`, ingest/src/arrival.rs).
    pub arrival_radius_m: f64,
    /// Hysteresis band of the radius, metres: a point counts as arrived within
    /// `arrival_radius_m - arrival_margin_m`, so GPS jitter around the radius reports nothing.
    pub arrival_margin_m: f64,
    /// Cap of the Redis events stream: `notify.stream_max`, set from there.
    #[serde(skip)]
    pub events_stream_max: u64,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            group: "ingest".into(),
            status_group: "ingest-status".into(),
            workers: 1,
            queue_capacity: 65_536,
            batch_max: 512,
            max_in_flight: 4,
            batch_linger: Duration::from_millis(2),
            evict_after: Duration::from_secs(60),
            seen_every: Duration::from_secs(20),
            sweep_every: Duration::from_secs(5),
            seq_reset_after: Duration::from_secs(30),
            seq_forget_after: Duration::from_secs(24 * 3600),
            max_payload_bytes: 512,
            max_future_skew: Duration::from_secs(300),
            redis_retry_for: Duration::from_secs(5),
            arrival_radius_m: 150.0,
            arrival_margin_m: 30.0,
            events_stream_max: 100_000,
        }
    }
}

impl IngestConfig {
    /// The first part of the workers' MQTT client ids.
    pub(crate) fn client_role(&self) -> &str {
        if self.group.is_empty() {
            "ingest"
        } else {
            &self.group
        }
    }

    /// Checks the settings once at start-up; the error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use courier_wire::topic::valid_group;
        if self.redis_retry_for > Duration::from_secs(20) {
            return Err(ConfigError::new("ingest.redis_retry_for", "must be at most 20s (the batch script keeps a batch's verdicts 30s for its retries)"));
        }
        if !valid_group(&self.group) {
            return Err(ConfigError::new(
                "ingest.group",
                format!("{:?} is not a valid group name", self.group),
            ));
        }
        if !valid_group(&self.status_group)
            || (!self.group.is_empty() && self.status_group == self.group)
        {
            return Err(ConfigError::new(
                "ingest.status_group",
                format!(
                    "{:?} must be a valid group name different from ingest.group",
                    self.status_group
                ),
            ));
        }
        if (self.group.is_empty() || self.status_group.is_empty()) && self.workers > 1 {
            return Err(ConfigError::new("ingest.workers", "must be 1 when ingest.group or ingest.status_group is \"\" (a plain subscription gives every worker every message)"));
        }
        let positive = [
            ("ingest.workers", self.workers),
            ("ingest.queue_capacity", self.queue_capacity),
            ("ingest.batch_max", self.batch_max),
            ("ingest.max_in_flight", self.max_in_flight),
            ("ingest.max_payload_bytes", self.max_payload_bytes),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        if self.batch_linger > Duration::from_millis(50) {
            return Err(ConfigError::new(
                "ingest.batch_linger",
                "must be at most 50ms",
            ));
        }
        // Lua's unpack() is limited to about 8000 values; a batch puts 3 per point into GEOADD.
        if self.batch_max > 2000 {
            return Err(ConfigError::new("ingest.batch_max", "must be at most 2000"));
        }
        if self.evict_after < Duration::from_secs(1) || self.sweep_every.is_zero() {
            return Err(ConfigError::new(
                "ingest.evict_after",
                "must be at least 1s and ingest.sweep_every above 0",
            ));
        }
        if !(self.arrival_radius_m.is_finite()
            && self.arrival_margin_m >= 0.0
            && self.arrival_margin_m < self.arrival_radius_m
            && self.arrival_radius_m <= 10_000.0)
        {
            return Err(ConfigError::new(
                "ingest.arrival_margin_m",
                "must be at least 0 and below ingest.arrival_radius_m (at most 10000)",
            ));
        }
        // An evicted courier's next point must fall into a new bucket (it rewrites `seen`).
        if self.seen_every >= self.evict_after {
            return Err(ConfigError::new(
                "ingest.seen_every",
                "must be below ingest.evict_after (its default is 20s: set it too when evict_after is 20s or less)",
            ));
        }
        if self.seq_forget_after < self.evict_after {
            return Err(ConfigError::new(
                "ingest.seq_forget_after",
                "must be at least ingest.evict_after",
            ));
        }
        Ok(())
    }

    /// The arrival rule of these settings.
    pub fn arrival(&self) -> crate::arrival::Rule {
        crate::arrival::Rule {
            radius_m: self.arrival_radius_m,
            margin_m: self.arrival_margin_m,
        }
    }

    /// The point limits derived from these settings.
    pub fn validation(&self) -> courier_wire::Validation {
        courier_wire::Validation {
            max_payload_bytes: self.max_payload_bytes,
            max_future_skew_secs: self.max_future_skew.as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        IngestConfig::default().validate().unwrap();
    }

    #[test]
    fn durations_parse_from_humantime() {
        let c: IngestConfig = toml_like("evict_after = \"2m\"");
        assert_eq!(c.evict_after, Duration::from_secs(120));
    }

    /// `c` is refused, and the error names `setting`.
    fn refused(c: IngestConfig, setting: &str) {
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(setting), "{e}");
    }

    #[test]
    fn bad_settings_name_themselves() {
        refused(
            IngestConfig {
                batch_max: 0,
                ..Default::default()
            },
            "ingest.batch_max",
        );
        refused(
            IngestConfig {
                status_group: "ingest".into(),
                ..Default::default()
            },
            "ingest.status_group",
        );
        refused(
            IngestConfig {
                seen_every: Duration::from_secs(60),
                ..Default::default()
            },
            "ingest.seen_every",
        );
        refused(
            IngestConfig {
                batch_linger: Duration::from_millis(51),
                ..Default::default()
            },
            "ingest.batch_linger",
        );
        let c = IngestConfig {
            seen_every: Duration::ZERO,
            ..Default::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn no_group_means_one_worker() {
        let plain = IngestConfig {
            group: String::new(),
            status_group: String::new(),
            ..Default::default()
        };
        plain.validate().unwrap();
        assert_eq!(plain.client_role(), "ingest");
        refused(
            IngestConfig {
                workers: 2,
                ..plain
            },
            "ingest.workers",
        );
    }

    fn toml_like(line: &str) -> IngestConfig {
        // A one-line `key = "value"` parser is enough here and keeps toml out of this crate.
        let (k, v) = line.split_once(" = ").unwrap();
        let v = v.trim_matches('"');
        let map = std::collections::HashMap::from([(k.to_string(), v.to_string())]);
        let de =
            serde::de::value::MapDeserializer::<_, serde::de::value::Error>::new(map.into_iter());
        IngestConfig::deserialize(de).unwrap()
    }
}
