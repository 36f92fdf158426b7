//! Settings of the history role (`[history]` in the config file).

use courier_wire::ConfigError;
use serde::Deserialize;
use std::time::Duration;

/// History settings as read from the file, with defaults for everything.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Shared-subscription group of the point stream (`$share/<group>/couriers/+/loc`). Never
    /// the ingest group: a group shares its messages out, so history would get only a part.
    /// `""`: a plain subscription, for a node where this process is the only history writer
    /// (rumqttd then forwards in runs instead of one message per router pass).
    pub group: String,
    /// MQTT clients of this process in the group, all feeding one buffer (1 without a group).
    pub mqtt_clients: usize,
    /// Rows waiting for PostgreSQL. When full, the OLDEST rows are dropped and counted
    /// (`history_rows_dropped_total{reason="buffer_full"}`). About 110 B per row (72 B in the
    /// queue plus the courier id's allocation), so the default of 1,000,000 rows is about 110 MB,
    /// or 400 s of 10,000 couriers sending every 4 s.
    pub buffer_rows: usize,
    /// PostgreSQL connections writing batches at once (each takes the next batch from the
    /// buffer): while one commits, another copies.
    pub writers: usize,
    /// Most rows per COPY.
    pub batch_max: usize,
    /// A batch is written once its first row has waited this long, full or not (at most 1 s).
    #[serde(with = "courier_wire::duration")]
    pub batch_max_age: Duration,
    /// Partitions exist for today and this many days ahead.
    pub days_ahead: u32,
    /// Partitions whose whole UTC day is older than this many days are dropped.
    pub retention_days: u32,
    /// Whether this writer creates partitions ahead and drops them past retention. Off when
    /// pg_partman (or an operator) does it; a batch hitting a day without a partition still
    /// creates that one partition rather than losing its rows.
    pub partition_upkeep: bool,
    /// How often partition upkeep runs (create ahead, drop past retention).
    #[serde(with = "courier_wire::duration")]
    pub upkeep_every: Duration,
    /// How often the `courier:order` snapshot is refreshed from Redis (at most 1 s).
    #[serde(with = "courier_wire::duration")]
    pub order_refresh: Duration,
    /// Longest wait between two attempts while PostgreSQL is down (backoff doubles up to it).
    #[serde(with = "courier_wire::duration")]
    pub retry_max_backoff: Duration,
    /// On shutdown, how long the buffer may take to flush; what is left is counted as dropped
    /// (`reason="shutdown"`).
    #[serde(with = "courier_wire::duration")]
    pub flush_deadline: Duration,
    /// Longest trail window one request may read.
    #[serde(with = "courier_wire::duration")]
    pub trail_max_window: Duration,
    /// PostgreSQL connections the trail API keeps (and requests it serves at once).
    pub trail_connections: usize,
    /// Most points one trail answer holds (each in memory while it is built, four requests at
    /// once); a window with more gets 413 and the caller asks for a shorter one.
    pub trail_max_points: usize,
    /// A persistent MQTT session: this writer's clients connect as `<session>-<n>` with
    /// `clean_session = false` and keep their subscription when they stop, so the broker holds
    /// what arrives while the writer restarts and hands it over when it is back (rumqttd from
    /// its topic log; Mosquitto needs `queue_qos0_messages true`). One name per writer process;
    /// unset: a fresh session each start (the restart window is lost at the broker).
    pub session: Option<String>,
    /// Whether this writer computes the anonymous aggregates (per geohash-6 cell and hour,
    /// docs/privacy.md). While on, the partition drop keeps a day until it is aggregated.
    pub aggregates: bool,
    /// The k of the aggregates: a cell-hour is written only where at least this many distinct
    /// couriers were present, so that none can be singled out (at least 2).
    pub aggregate_min_couriers: u32,
    /// Aggregates older than this many days are deleted.
    pub aggregate_retention_days: u32,
    /// An hour is aggregated this long after it ends: rows of an hour keep arriving while a
    /// writer's buffer holds them (later ones are in the trail, not in the aggregates).
    #[serde(with = "courier_wire::duration")]
    pub aggregate_delay: Duration,
    /// How often the aggregator looks for closed hours.
    #[serde(with = "courier_wire::duration")]
    pub aggregate_every: Duration,
    /// Rows of the audit logs (`trail_access_log`, `erasure_log`) older than this many days
    /// are deleted: they name couriers too.
    pub audit_retention_days: u32,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            group: "history".into(),
            mqtt_clients: 1,
            buffer_rows: 1_000_000,
            writers: 2,
            batch_max: 20_000,
            batch_max_age: Duration::from_secs(1),
            days_ahead: 3,
            retention_days: 30,
            partition_upkeep: true,
            upkeep_every: Duration::from_secs(600),
            order_refresh: Duration::from_secs(1),
            retry_max_backoff: Duration::from_secs(5),
            flush_deadline: Duration::from_secs(5),
            trail_max_window: Duration::from_secs(24 * 3600),
            trail_connections: 4,
            trail_max_points: 100_000,
            session: None,
            aggregates: true,
            aggregate_min_couriers: 5,
            aggregate_retention_days: 730,
            aggregate_delay: Duration::from_secs(600),
            aggregate_every: Duration::from_secs(60),
            audit_retention_days: 365,
        }
    }
}

impl HistoryConfig {
    /// Checks the settings once at start-up; the error starts with the setting's name.
    pub fn validate(&self, ingest_group: &str) -> Result<(), ConfigError> {
        if !courier_wire::topic::valid_group(&self.group) {
            return Err(ConfigError::new(
                "history.group",
                format!("{:?} is not a valid group name", self.group),
            ));
        }
        if !self.group.is_empty() && self.group == ingest_group {
            return Err(ConfigError::new("history.group", format!("{:?} must differ from ingest.group: one group shares its points out between its members",
                self.group
            )));
        }
        if let Some(s) = &self.session {
            if !courier_wire::topic::valid_id(s) {
                return Err(ConfigError::new(
                    "history.session",
                    format!("{s:?} must be 1-64 of [A-Za-z0-9._:-]"),
                ));
            }
        }
        for (name, v) in [
            ("history.mqtt_clients", self.mqtt_clients),
            ("history.buffer_rows", self.buffer_rows),
            ("history.batch_max", self.batch_max),
            ("history.writers", self.writers),
            ("history.trail_connections", self.trail_connections),
            ("history.trail_max_points", self.trail_max_points),
        ] {
            if v == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        if self.group.is_empty() && self.mqtt_clients > 1 {
            return Err(ConfigError::new("history.mqtt_clients", "must be 1 when history.group is \"\" (a plain subscription gives every client every point)"));
        }
        if self.writers > 16 {
            return Err(ConfigError::new("history.writers", "must be at most 16"));
        }
        if self.batch_max > self.buffer_rows {
            return Err(ConfigError::new(
                "history.batch_max",
                "must be at most history.buffer_rows",
            ));
        }
        let second = Duration::from_secs(1);
        if self.batch_max_age.is_zero() || self.batch_max_age > second {
            return Err(ConfigError::new(
                "history.batch_max_age",
                "must be above 0 and at most 1s",
            ));
        }
        if self.order_refresh.is_zero() || self.order_refresh > second {
            return Err(ConfigError::new(
                "history.order_refresh",
                "must be above 0 and at most 1s",
            ));
        }
        if self.retention_days == 0 {
            return Err(ConfigError::new(
                "history.retention_days",
                "must be at least 1",
            ));
        }
        if self.days_ahead > 60 {
            return Err(ConfigError::new("history.days_ahead", "must be at most 60"));
        }
        if self.upkeep_every < second || self.upkeep_every > Duration::from_secs(6 * 3600) {
            return Err(ConfigError::new(
                "history.upkeep_every",
                "must be between 1s and 6h",
            ));
        }
        if self.retry_max_backoff < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "history.retry_max_backoff",
                "must be at least 10ms",
            ));
        }
        if self.trail_max_window < Duration::from_secs(60) {
            return Err(ConfigError::new(
                "history.trail_max_window",
                "must be at least 1m",
            ));
        }
        if self.aggregate_min_couriers < 2 {
            return Err(ConfigError::new(
                "history.aggregate_min_couriers",
                "must be at least 2: a cell of one courier is his trail",
            ));
        }
        if self.aggregate_retention_days == 0 {
            return Err(ConfigError::new(
                "history.aggregate_retention_days",
                "must be at least 1",
            ));
        }
        if self.aggregate_delay > Duration::from_secs(12 * 3600) {
            return Err(ConfigError::new(
                "history.aggregate_delay",
                "must be at most 12h (a day is dropped only once aggregated)",
            ));
        }
        if self.aggregate_every < second || self.aggregate_every > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "history.aggregate_every",
                "must be between 1s and 1h",
            ));
        }
        if self.audit_retention_days == 0 {
            return Err(ConfigError::new(
                "history.audit_retention_days",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        HistoryConfig::default().validate("ingest").unwrap();
    }

    #[test]
    fn no_group_means_one_client() {
        let plain = HistoryConfig {
            group: String::new(),
            ..Default::default()
        };
        // Both plain: each takes every point, nothing is shared out.
        plain.validate("").unwrap();
        let two = HistoryConfig {
            mqtt_clients: 2,
            ..plain
        };
        assert!(two
            .validate("")
            .unwrap_err()
            .to_string()
            .starts_with("history.mqtt_clients"));
    }

    #[test]
    fn bad_settings_name_themselves() {
        let c = HistoryConfig::default();
        assert!(c
            .validate("history")
            .unwrap_err()
            .to_string()
            .starts_with("history.group"));
        let c = HistoryConfig {
            buffer_rows: 0,
            ..Default::default()
        };
        assert!(c
            .validate("ingest")
            .unwrap_err()
            .to_string()
            .starts_with("history.buffer_rows"));
        let c = HistoryConfig {
            batch_max_age: Duration::from_secs(2),
            ..Default::default()
        };
        assert!(c
            .validate("ingest")
            .unwrap_err()
            .to_string()
            .starts_with("history.batch_max_age"));
        let c = HistoryConfig {
            retention_days: 0,
            ..Default::default()
        };
        assert!(c
            .validate("ingest")
            .unwrap_err()
            .to_string()
            .starts_with("history.retention_days"));
        let c = HistoryConfig {
            aggregate_min_couriers: 1,
            ..Default::default()
        };
        assert!(c
            .validate("ingest")
            .unwrap_err()
            .to_string()
            .starts_with("history.aggregate_min_couriers"));
        let c = HistoryConfig {
            group: "a+b".into(),
            ..Default::default()
        };
        assert!(c
            .validate("ingest")
            .unwrap_err()
            .to_string()
            .starts_with("history.group"));
    }
}
