//! The circuit breaker of one webhook endpoint: the pure rule. Its state lives in the
//! endpoint's row (`failures`, `open_until`), so every dispatcher process sees the same one.
//!
//! | state     | when                                        | dispatchers                  |
//! |-----------|---------------------------------------------|------------------------------|
//! | closed    | `failures < open_after`                     | deliver every due delivery   |
//! | open      | `open_until > now`                          | deliver nothing to it        |
//! | half-open | `failures >= open_after`, `open_until <= now` | deliver ONE due delivery (a probe) |
//!
//! A success closes it (`failures = 0`); a failure at or past `open_after` (re)opens it for
//! `open_for`. A dead endpoint thus costs one attempt per `open_for`, not one per delivery,
//! and its deliveries keep their own retry schedule meanwhile (they wait, their attempts are
//! not spent).

use std::time::Duration;

/// The breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Breaker {
    /// Consecutive failed attempts that open it.
    pub open_after: u32,
    /// How long it stays open before a probe.
    pub open_for: Duration,
}

/// The endpoint row's new breaker fields after one attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct After {
    pub failures: u32,
    /// `Some(d)`: open for `d` from now.
    pub open_for: Option<Duration>,
}

impl Breaker {
    pub(crate) fn after(&self, failures_before: u32, succeeded: bool) -> After {
        if succeeded {
            return After {
                failures: 0,
                open_for: None,
            };
        }
        let failures = failures_before.saturating_add(1);
        After {
            failures,
            open_for: (failures >= self.open_after).then_some(self.open_for),
        }
    }

    /// Whether a dispatcher should send only one probe to an endpoint with this many failures
    /// (the claim query's rule, written here to be tested).
    pub(crate) fn probing(&self, failures: u32) -> bool {
        failures >= self.open_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_n_failures_reopens_on_a_failed_probe_closes_on_success() {
        let b = Breaker {
            open_after: 3,
            open_for: Duration::from_secs(30),
        };
        let mut f = 0;
        for expect_open in [false, false, true, true] {
            let a = b.after(f, false);
            assert_eq!(
                a.open_for.is_some(),
                expect_open,
                "after {} failures",
                a.failures
            );
            f = a.failures;
        }
        assert!(b.probing(f));
        assert_eq!(
            b.after(f, true),
            After {
                failures: 0,
                open_for: None
            }
        );
        assert!(!b.probing(0));
    }
}
