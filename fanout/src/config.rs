//! Settings of the fanout role (`[fanout]` in the config file).

use courier_wire::ConfigError;
use serde::Deserialize;
use std::time::Duration;

/// Fanout settings as read from the file, with defaults for everything.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FanoutConfig {
    /// Bearer key the order service presents to the orders API (`SERVICE_KEY`). At least 16
    /// bytes. Unset: the fanout role refuses to start (`run` leaves fanout out).
    pub service_key: Option<String>,
    /// Lifetime of a tracking token. Short: a leaked token shows one order for this long at
    /// most, and never after the order ends.
    #[serde(with = "courier_wire::duration")]
    pub token_ttl: Duration,
    /// At most one point per viewer per this interval (the newest wins); `0s` sends every
    /// point.
    #[serde(with = "courier_wire::duration")]
    pub send_interval: Duration,
    /// Points waiting for one viewer. When full, the oldest is dropped and counted
    /// (`fanout_points_dropped_total{reason="queue_full"}`): a slow viewer never slows others.
    pub queue_capacity: usize,
    /// Viewers one gateway process holds; more are refused (`reason="max_viewers"`). Also
    /// bounded by the process's open-file limit.
    pub max_viewers: usize,
    /// Sessions one tracking token may hold at once (a customer's phone and laptop, a
    /// restaurant's screens); more are refused (`reason="token_sessions"`).
    pub max_sessions_per_token: usize,
    /// The WebSocket URL handed out with a token; unset: `ws://<WS_LISTEN>/mqtt`.
    pub public_ws_url: Option<String>,
    /// Base URL of the tracking page (`<base>/track/<order>?token=...`) handed out as
    /// `tracking_url`; not read from the file: the process sets it from `web.public_url` when
    /// it serves the maps. `None`: no `tracking_url`.
    #[serde(skip)]
    pub tracking_page_url: Option<String>,
    /// Time a new connection has to finish the WebSocket handshake and send CONNECT.
    #[serde(with = "courier_wire::duration")]
    pub connect_timeout: Duration,
    /// Largest MQTT packet accepted from a viewer, bytes (a viewer only sends small ones).
    pub max_packet_bytes: usize,
    /// How long an idempotency record of an order event is kept.
    #[serde(with = "courier_wire::duration")]
    pub idempotency_ttl: Duration,
    /// Cap of the Redis events stream: `notify.stream_max`, set from there.
    #[serde(skip)]
    pub events_stream_max: u64,
    /// Orders one courier may carry at once (stacked deliveries); one more is refused (409).
    pub max_orders_per_courier: usize,
}

impl std::fmt::Debug for FanoutConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The service key never reaches logs.
        f.debug_struct("FanoutConfig")
            .field("service_key", &self.service_key.as_ref().map(|_| "<set>"))
            .field("token_ttl", &self.token_ttl)
            .field("send_interval", &self.send_interval)
            .field("queue_capacity", &self.queue_capacity)
            .field("max_viewers", &self.max_viewers)
            .field("max_sessions_per_token", &self.max_sessions_per_token)
            .field("public_ws_url", &self.public_ws_url)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_packet_bytes", &self.max_packet_bytes)
            .field("idempotency_ttl", &self.idempotency_ttl)
            .field("events_stream_max", &self.events_stream_max)
            .field("max_orders_per_courier", &self.max_orders_per_courier)
            .finish()
    }
}

impl Default for FanoutConfig {
    fn default() -> Self {
        FanoutConfig {
            service_key: None,
            token_ttl: Duration::from_secs(15 * 60),
            send_interval: Duration::ZERO,
            queue_capacity: 16,
            max_viewers: 50_000,
            max_sessions_per_token: 4,
            public_ws_url: None,
            tracking_page_url: None,
            connect_timeout: Duration::from_secs(5),
            max_packet_bytes: 4096,
            idempotency_ttl: Duration::from_secs(24 * 3600),
            events_stream_max: 100_000,
            max_orders_per_courier: 4,
        }
    }
}

impl FanoutConfig {
    /// Checks the settings once at start-up; the error names the setting. The service key is
    /// checked where it is needed ([`FanoutConfig::require_service_key`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(k) = &self.service_key {
            if k.len() < 16 {
                return Err(ConfigError::new("SERVICE_KEY", "must be at least 16 bytes"));
            }
        }
        if self.token_ttl < Duration::from_secs(10)
            || self.token_ttl > Duration::from_secs(24 * 3600)
        {
            return Err(ConfigError::new(
                "fanout.token_ttl",
                "must be between 10s and 24h",
            ));
        }
        if self.send_interval > Duration::from_secs(60) {
            return Err(ConfigError::new(
                "fanout.send_interval",
                "must be at most 60s",
            ));
        }
        for (name, v) in [
            ("fanout.queue_capacity", self.queue_capacity),
            ("fanout.max_viewers", self.max_viewers),
            ("fanout.max_sessions_per_token", self.max_sessions_per_token),
            ("fanout.max_orders_per_courier", self.max_orders_per_courier),
        ] {
            if v == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        if self.max_packet_bytes < 256 {
            return Err(ConfigError::new(
                "fanout.max_packet_bytes",
                "must be at least 256",
            ));
        }
        if self.connect_timeout.is_zero() || self.idempotency_ttl < Duration::from_secs(60) {
            return Err(ConfigError::new(
                "fanout.connect_timeout",
                "must be above 0 and fanout.idempotency_ttl at least 60s",
            ));
        }
        if let Some(u) = &self.public_ws_url {
            if !(u.starts_with("ws://") || u.starts_with("wss://")) {
                return Err(ConfigError::new(
                    "fanout.public_ws_url",
                    format!("{u:?} must start with ws:// or wss://"),
                ));
            }
        }
        Ok(())
    }

    /// The service key, or the error that stops the fanout role.
    pub(crate) fn require_service_key(&self) -> Result<&str, String> {
        self.service_key
            .as_deref()
            .ok_or_else(|| "SERVICE_KEY is required by the fanout role".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_need_a_key_to_run() {
        let c = FanoutConfig::default();
        c.validate().unwrap();
        assert!(c.require_service_key().is_err());
    }

    #[test]
    fn bad_settings_name_themselves() {
        let bad = |c: FanoutConfig| c.validate().unwrap_err().to_string();
        assert!(bad(FanoutConfig {
            service_key: Some("short".into()),
            ..Default::default()
        })
        .contains("SERVICE_KEY"));
        assert!(bad(FanoutConfig {
            token_ttl: Duration::from_secs(1),
            ..Default::default()
        })
        .contains("fanout.token_ttl"));
        assert!(bad(FanoutConfig {
            queue_capacity: 0,
            ..Default::default()
        })
        .contains("fanout.queue_capacity"));
        assert!(bad(FanoutConfig {
            public_ws_url: Some("http://x".into()),
            ..Default::default()
        })
        .contains("public_ws_url"));
    }

    #[test]
    fn debug_hides_the_service_key() {
        let c = FanoutConfig {
            service_key: Some("very-secret-service-key".into()),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("very-secret"));
    }
}
