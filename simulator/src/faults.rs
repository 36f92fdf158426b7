//! Faults on demand, drawn once per courier at the start: a network outage, an app restart,
//! a GPS stuck at a default location. Pure: times are unix seconds handed in.

use crate::config::Faults;
use rand::Rng;

/// The faults of one phone during a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Plan {
    /// Offline from `.0` to `.1`: points are buffered, then flushed after the first live one.
    pub outage: Option<(f64, f64)>,
    /// The app restarts at this time: connection dropped, seq starts again at 1.
    pub restart_at: Option<f64>,
    /// The GPS reports `Faults::default_at` for the whole run.
    pub default_location: bool,
}

impl Plan {
    /// Draws the faults of one courier; `start` is the run's start, `window` its length in
    /// seconds. Every fault time falls inside `[start, start + window]`.
    pub(crate) fn draw(f: &Faults, start: f64, window: f64, rng: &mut impl Rng) -> Plan {
        let mut p = Plan::default();
        if f.outage > 0.0 && rng.random_bool(f.outage.min(1.0)) {
            let len = f.outage_for.as_secs_f64().min(window);
            let at = start + rng.random_range(0.0..=(window - len).max(0.0));
            p.outage = Some((at, at + len));
        }
        if f.restart > 0.0 && rng.random_bool(f.restart.min(1.0)) {
            p.restart_at = Some(start + rng.random_range(0.0..=window.max(0.0)));
        }
        p.default_location =
            f.default_location > 0.0 && rng.random_bool(f.default_location.min(1.0));
        p
    }

    /// Any fault that changes the stream a customer would watch.
    pub(crate) fn is_faulty(&self) -> bool {
        self.outage.is_some() || self.restart_at.is_some() || self.default_location
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{rngs::SmallRng, SeedableRng};
    use std::time::Duration;

    #[test]
    fn fractions_are_roughly_kept() {
        let f = Faults {
            outage: 0.1,
            restart: 0.2,
            default_location: 0.3,
            ..Default::default()
        };
        let mut rng = SmallRng::seed_from_u64(3);
        let plans: Vec<Plan> = (0..10_000)
            .map(|_| Plan::draw(&f, 1000.0, 60.0, &mut rng))
            .collect();
        let share = |n: usize| n as f64 / plans.len() as f64;
        assert!((share(plans.iter().filter(|p| p.outage.is_some()).count()) - 0.1).abs() < 0.02);
        assert!(
            (share(plans.iter().filter(|p| p.restart_at.is_some()).count()) - 0.2).abs() < 0.02
        );
        assert!((share(plans.iter().filter(|p| p.default_location).count()) - 0.3).abs() < 0.02);
    }

    #[test]
    fn no_faults_asked_none_drawn() {
        let mut rng = SmallRng::seed_from_u64(4);
        for _ in 0..1000 {
            assert_eq!(
                Plan::draw(&Faults::default(), 0.0, 60.0, &mut rng),
                Plan::default()
            );
        }
    }

    proptest! {
        #[test]
        fn fault_times_fall_inside_the_window(seed: u64, window in 1.0f64..600.0, outage_for in 0.0f64..900.0) {
            let f = Faults {
                outage: 1.0,
                restart: 1.0,
                outage_for: Duration::from_secs_f64(outage_for),
                ..Default::default()
            };
            let p = Plan::draw(&f, 500.0, window, &mut SmallRng::seed_from_u64(seed));
            let (a, b) = p.outage.unwrap();
            prop_assert!(a >= 500.0 && a <= b && b <= 500.0 + window + 1e-9);
            prop_assert!((b - a - outage_for.min(window)).abs() < 1e-6);
            let r = p.restart_at.unwrap();
            prop_assert!((500.0..=500.0 + window).contains(&r));
        }
    }
}
