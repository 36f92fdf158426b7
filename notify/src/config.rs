//! The notify role's settings (`[notify]`), with defaults; checked once at start-up.

use crate::breaker::Breaker;
use crate::retry::Policy;
use courier_wire::ConfigError;
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NotifyConfig {
    /// Order events the Redis events stream holds at most, for the relays to take. Past it the
    /// scripts that emit count new events (`notify_events_dropped_total`) instead of writing
    /// them; `0` writes no events at all (no notify role deployed). About 150 B each.
    pub stream_max: u64,
    /// Consumer group of the relays on the Redis events stream (several processes share it).
    pub group: String,
    /// Events the relay moves from Redis to the outbox per round.
    pub relay_batch: usize,
    /// An event a relay took but never recorded (the process died) is taken over by another
    /// relay after this long.
    #[serde(with = "courier_wire::duration")]
    pub relay_claim_after: Duration,
    /// How often an idle dispatcher looks for due deliveries.
    #[serde(with = "courier_wire::duration")]
    pub poll_interval: Duration,
    /// Deliveries one dispatcher process has in flight at most (also its claim size).
    pub concurrency: usize,
    /// One attempt's time limit (connect, send, answer).
    #[serde(with = "courier_wire::duration")]
    pub timeout: Duration,
    /// A claimed delivery is another dispatcher's to try after this long (this one died).
    /// Longer than `timeout`.
    #[serde(with = "courier_wire::duration")]
    pub lease: Duration,
    /// First retry ceiling; doubles per attempt (full jitter: the delay is uniform below it).
    #[serde(with = "courier_wire::duration")]
    pub retry_base: Duration,
    /// Longest wait between two attempts (also caps `Retry-After`).
    #[serde(with = "courier_wire::duration")]
    pub retry_max_delay: Duration,
    /// A delivery still failing this long after its first attempt is dead (dead-letter list).
    #[serde(with = "courier_wire::duration")]
    pub give_up_after: Duration,
    /// ... or after this many attempts.
    pub max_attempts: u32,
    /// Consecutive failed attempts that open an endpoint's circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker holds an endpoint's deliveries before one probe.
    #[serde(with = "courier_wire::duration")]
    pub breaker_open: Duration,
    /// Delivered deliveries (and events with nothing left to deliver) are deleted after this.
    #[serde(with = "courier_wire::duration")]
    pub keep_delivered: Duration,
    /// Dead letters are deleted after this (replay them before).
    #[serde(with = "courier_wire::duration")]
    pub keep_dead: Duration,
    /// The push provider adapter notices to customers' apps are POSTed to (notify/src/push.rs);
    /// unset: no notices.
    pub push_url: Option<String>,
    /// Bearer key sent to the push provider, if it wants one.
    pub push_key: Option<String>,
    /// Event kinds a customer's registered device is notified of, once each.
    pub push_kinds: Vec<String>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            stream_max: 100_000,
            group: "notify".into(),
            relay_batch: 500,
            relay_claim_after: Duration::from_secs(30),
            poll_interval: Duration::from_millis(250),
            concurrency: 64,
            timeout: Duration::from_secs(10),
            lease: Duration::from_secs(60),
            retry_base: Duration::from_secs(2),
            retry_max_delay: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(24 * 3600),
            max_attempts: 60,
            breaker_failures: 10,
            breaker_open: Duration::from_secs(60),
            keep_delivered: Duration::from_secs(7 * 24 * 3600),
            keep_dead: Duration::from_secs(30 * 24 * 3600),
            push_url: None,
            push_key: None,
            push_kinds: vec![
                "order.picked_up".into(),
                "courier.arriving_dropoff".into(),
                "order.delivered".into(),
            ],
        }
    }
}

impl NotifyConfig {
    /// Checks the settings; the error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.group.is_empty() {
            return Err(ConfigError::new("notify.group", "must not be empty"));
        }
        for (name, v) in [
            ("notify.relay_batch", self.relay_batch),
            ("notify.concurrency", self.concurrency),
            ("notify.max_attempts", self.max_attempts as usize),
            ("notify.breaker_failures", self.breaker_failures as usize),
        ] {
            if v == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        if self.timeout.is_zero() || self.lease <= self.timeout {
            return Err(ConfigError::new(
                "notify.lease",
                "must be longer than notify.timeout (and timeout > 0)",
            ));
        }
        if self.retry_base.is_zero() || self.retry_max_delay < self.retry_base {
            return Err(ConfigError::new(
                "notify.retry_max_delay",
                "must be at least notify.retry_base (> 0)",
            ));
        }
        if self.poll_interval.is_zero() || self.relay_claim_after.is_zero() {
            return Err(ConfigError::new(
                "notify.poll_interval",
                "and notify.relay_claim_after must be > 0",
            ));
        }
        if let Some(u) = &self.push_url {
            crate::api::check_url(u).map_err(|e| ConfigError::new("notify.push_url", e))?;
        }
        if let Some(k) = self
            .push_kinds
            .iter()
            .find(|k| !courier_wire::events::KINDS.contains(&k.as_str()))
        {
            return Err(ConfigError::new(
                "notify.push_kinds",
                format!("unknown kind {k:?}"),
            ));
        }
        Ok(())
    }

    /// The kinds notices are made for: none without a provider.
    pub(crate) fn notice_kinds(&self) -> &[String] {
        if self.push_url.is_some() {
            &self.push_kinds
        } else {
            &[]
        }
    }

    pub(crate) fn policy(&self) -> Policy {
        Policy {
            base: self.retry_base,
            max_delay: self.retry_max_delay,
            give_up_after: self.give_up_after,
            max_attempts: self.max_attempts,
        }
    }

    pub(crate) fn breaker(&self) -> Breaker {
        Breaker {
            open_after: self.breaker_failures,
            open_for: self.breaker_open,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_their_setting() {
        NotifyConfig::default().validate().unwrap();
        let c = NotifyConfig {
            lease: Duration::from_secs(5),
            ..NotifyConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("notify.lease"));
        let c = NotifyConfig {
            concurrency: 0,
            ..NotifyConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("notify.concurrency"));
    }
}
