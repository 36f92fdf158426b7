//! When a failed delivery is tried again, or given up: the pure rule, with no clock or I/O.
//!
//! | after attempt n failed with | next attempt in                                  |
//! |-----------------------------|--------------------------------------------------|
//! | `Retry-After: s` (429, 503) | `min(s, max_delay)` (the receiver's wish, capped) |
//! | anything else               | uniform in `[0, min(max_delay, base * 2^(n-1)))` |
//!
//! "Full jitter" (AWS architecture blog, and `../shared/seeds/webhook-delivery.ar.txt`): after
//! an outage every sender retries at a different moment instead of all at once. The delivery
//! is dead (to the dead-letter list) once `n` reaches `max_attempts` or the next attempt would
//! fall later than `give_up_after` after the first one.

use std::time::{Duration, SystemTime};

/// The retry settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    pub base: Duration,
    pub max_delay: Duration,
    pub give_up_after: Duration,
    pub max_attempts: u32,
}

/// What follows a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Next {
    Retry(Duration),
    Dead,
}

impl Policy {
    /// `attempts`: attempts made so far, this one included (>= 1); `age`: time since the first
    /// attempt; `unit`: a random number in `[0, 1)`.
    pub(crate) fn after_failure(
        &self,
        attempts: u32,
        age: Duration,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Next {
        if attempts >= self.max_attempts {
            return Next::Dead;
        }
        let delay = match retry_after {
            Some(s) => s.min(self.max_delay),
            None => {
                let exp = attempts.saturating_sub(1).min(40);
                let ceiling = self
                    .base
                    .saturating_mul(1u32 << exp.min(31))
                    .min(self.max_delay);
                ceiling.mul_f64(unit.clamp(0.0, 1.0))
            }
        };
        if age.saturating_add(delay) > self.give_up_after {
            Next::Dead
        } else {
            Next::Retry(delay)
        }
    }
}

/// A `Retry-After` header (RFC 9110): delta-seconds or an HTTP date. Nonsense is ignored.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> Policy {
        Policy {
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(24 * 3600),
            max_attempts: 30,
        }
    }

    #[test]
    fn the_ceiling_doubles_then_stops_at_max_delay() {
        let p = policy();
        let almost = 0.999_999;
        let d = |n| match p.after_failure(n, Duration::ZERO, None, almost) {
            Next::Retry(d) => d.as_secs(),
            Next::Dead => panic!("dead"),
        };
        assert_eq!([d(1), d(2), d(3), d(4)], [0, 1, 3, 7]);
        assert_eq!(d(13), 3599);
        assert_eq!(d(29), 3599);
    }

    #[test]
    fn retry_after_is_honoured_but_capped() {
        let p = policy();
        let n = p.after_failure(1, Duration::ZERO, Some(Duration::from_secs(7)), 0.0);
        assert_eq!(n, Next::Retry(Duration::from_secs(7)));
        let n = p.after_failure(1, Duration::ZERO, Some(Duration::from_secs(99_999)), 0.0);
        assert_eq!(n, Next::Retry(Duration::from_secs(3600)));
    }

    #[test]
    fn gives_up_at_max_attempts_or_past_the_age_cap() {
        let p = policy();
        assert_eq!(p.after_failure(30, Duration::ZERO, None, 0.5), Next::Dead);
        let old = Duration::from_secs(24 * 3600 - 10);
        assert_eq!(
            p.after_failure(5, old, Some(Duration::from_secs(11)), 0.0),
            Next::Dead
        );
        assert_eq!(
            p.after_failure(5, old, Some(Duration::from_secs(9)), 0.0),
            Next::Retry(Duration::from_secs(9))
        );
    }

    #[test]
    fn retry_after_headers() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    proptest! {
        #[test]
        fn a_retry_is_never_later_than_the_ceiling_or_the_cap(
            n in 1u32..100, age in 0u64..100_000, unit in 0.0f64..1.0, ra in proptest::option::of(0u64..1_000_000)
        ) {
            let p = policy();
            let age = Duration::from_secs(age);
            match p.after_failure(n, age, ra.map(Duration::from_secs), unit) {
                Next::Retry(d) => {
                    prop_assert!(n < p.max_attempts);
                    prop_assert!(d <= p.max_delay);
                    prop_assert!(age + d <= p.give_up_after);
                    if ra.is_none() {
                        let ceiling = p.base.saturating_mul(1 << (n - 1).min(31)).min(p.max_delay);
                        prop_assert!(d <= ceiling);
                    }
                }
                // Dead by age only when even the longest delay would cross the cap.
                Next::Dead => prop_assert!(n >= p.max_attempts || age + p.max_delay > p.give_up_after),
            }
        }
    }
}
