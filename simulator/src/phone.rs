//! One courier's phone as a pure state machine: woken at the times it asks for, it moves the
//! courier, decides whether to send (profile), and applies its faults (outage with an offline
//! buffer, app restart, bad GPS). It returns what the network edge must do; it never touches
//! a socket or a clock.

use crate::config::{Profile, SimConfig};
use crate::faults::Plan;
use crate::motion::{distance_m, payload, Courier, SPEED_M_PER_S};
use rand::Rng;
use std::collections::VecDeque;

/// What a courier is doing, which sets how often his phone checks its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// Fixed profile: one point per interval, always.
    Fixed,
    ToRestaurant,
    ToCustomer,
    Available,
    /// Sends nothing and holds no connection.
    OffShift,
}

impl Kind {
    /// The kinds of a mix, in the order of [`crate::config::Mix::fractions`].
    pub(crate) const MIX: [Kind; 4] = [
        Kind::ToRestaurant,
        Kind::ToCustomer,
        Kind::Available,
        Kind::OffShift,
    ];

    pub(crate) fn delivering(self) -> bool {
        matches!(self, Kind::ToRestaurant | Kind::ToCustomer)
    }

    /// The kind of courier `i` of `n`: exact shares (within one courier) spread evenly over the
    /// ids, by a low-discrepancy sequence rather than blocks.
    pub(crate) fn of(profile: &Profile, i: usize) -> Kind {
        match profile {
            Profile::Fixed { .. } => Kind::Fixed,
            Profile::Mix(m) => {
                let x = (i as f64 * 0.618_033_988_749_894_9).fract();
                let mut acc = 0.0;
                for (k, f) in Kind::MIX.iter().zip(m.fractions()) {
                    acc += f;
                    if x < acc {
                        return *k;
                    }
                }
                Kind::OffShift
            }
        }
    }
}

/// What the network edge must do for a phone, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Open the courier's connection (with its Last Will `offline`).
    Connect,
    /// Lose the connection without a DISCONNECT, so the broker publishes the Last Will.
    Drop,
    /// Publish `online` on `couriers/<id>/status`.
    Online,
    /// Publish a live point.
    Send(Vec<u8>),
    /// Publish a point buffered while offline: its original ts and seq, older than the live one.
    Flush(Vec<u8>),
}

/// Counts of what the phones of one task did; added into the shared stats now and then.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counts {
    pub buffered: u64,
    pub buffer_dropped: u64,
    pub flushed: u64,
    pub null_island: u64,
    pub default_location: u64,
    pub outages: u64,
    pub restarts: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, o: &Counts) {
        self.buffered += o.buffered;
        self.buffer_dropped += o.buffer_dropped;
        self.flushed += o.flushed;
        self.null_island += o.null_island;
        self.default_location += o.default_location;
        self.outages += o.outages;
        self.restarts += o.restarts;
    }
}

/// One courier's phone.
#[derive(Debug, Clone)]
pub(crate) struct Phone {
    pub id: String,
    /// Number of the courier in the run: his connection goes to address `n % addresses`. The
    /// run's number rather than an index within a shard, so the spread does not depend on
    /// how phones are dealt to shards.
    pub n: usize,
    pub kind: Kind,
    pub plan: Plan,
    pub motion: Courier,
    still: bool,
    /// Where and when the last point was made (sent or buffered).
    last: Option<(f64, f64, f64)>,
    offline: bool,
    outage_begun: bool,
    restarted: bool,
    buffer: VecDeque<Vec<u8>>,
}

impl Phone {
    /// The phone of courier number `n` of the run, placed at random in the box at `now`.
    pub(crate) fn new(
        id: String,
        n: usize,
        kind: Kind,
        plan: Plan,
        cfg: &SimConfig,
        now: f64,
        rng: &mut impl Rng,
    ) -> Phone {
        let motion = Courier::new(cfg.bbox, rng, now);
        let still = match (&cfg.profile, kind) {
            (Profile::Mix(m), k) if k.delivering() => rng.random_bool(m.delivering_still),
            (Profile::Mix(m), Kind::Available) => rng.random_bool(m.available_still),
            _ => false,
        };
        Phone {
            id,
            n,
            kind,
            plan,
            motion,
            still,
            last: None,
            offline: false,
            outage_begun: false,
            restarted: false,
            buffer: VecDeque::new(),
        }
    }

    /// Sends at all?
    pub(crate) fn active(&self) -> bool {
        self.kind != Kind::OffShift
    }

    /// Shift start: the first wake comes after a random part of one period, so phones do not
    /// all send together. `None` for an off-shift courier.
    pub(crate) fn start(
        &self,
        cfg: &SimConfig,
        rng: &mut impl Rng,
        out: &mut Vec<Action>,
    ) -> Option<f64> {
        if !self.active() {
            return None;
        }
        out.push(Action::Connect);
        out.push(Action::Online);
        let (_, max) = self.period(cfg);
        Some(rng.random_range(0.0..max))
    }

    /// (min, max) seconds between two wakes.
    fn period(&self, cfg: &SimConfig) -> (f64, f64) {
        match (&cfg.profile, self.kind) {
            (Profile::Fixed { interval }, _) => (interval.as_secs_f64(), interval.as_secs_f64()),
            (Profile::Mix(m), k) if k.delivering() => m.delivering_every,
            (Profile::Mix(m), _) => m.available_every,
        }
    }

    /// Wakes the phone at `now` (unix seconds): pushes what to do into `out` and returns the
    /// seconds until the next wake.
    pub(crate) fn wake(
        &mut self,
        now: f64,
        cfg: &SimConfig,
        rng: &mut impl Rng,
        out: &mut Vec<Action>,
        counts: &mut Counts,
    ) -> f64 {
        let (min, max) = self.period(cfg);
        let gap = if max > min {
            rng.random_range(min..max)
        } else {
            min
        };

        if let Some(at) = self.plan.restart_at {
            if !self.restarted && now >= at {
                // The app is killed and started again: its buffer is lost, seq starts over.
                self.restarted = true;
                counts.restarts += 1;
                self.motion.seq = 0;
                self.buffer.clear();
                if !self.offline {
                    out.extend([Action::Drop, Action::Connect, Action::Online]);
                }
            }
        }
        if let Some((from, _)) = self.plan.outage {
            if !self.outage_begun && now >= from {
                self.outage_begun = true;
                self.offline = true;
                counts.outages += 1;
                out.push(Action::Drop);
            }
        }

        let speed = match &cfg.profile {
            Profile::Mix(m) => {
                if rng.random_bool((gap / m.spell).min(1.0)) {
                    let share = if self.kind.delivering() {
                        m.delivering_still
                    } else {
                        m.available_still
                    };
                    self.still = rng.random_bool(share);
                }
                if self.still {
                    0.0
                } else {
                    SPEED_M_PER_S
                }
            }
            Profile::Fixed { .. } => SPEED_M_PER_S,
        };
        self.motion.travel(now, speed, rng, cfg.bbox);
        let make = match (&cfg.profile, self.last) {
            (Profile::Fixed { .. }, _) | (_, None) => true,
            (Profile::Mix(m), Some((lat, lon, ts))) => {
                distance_m(lat, lon, self.motion.lat, self.motion.lon) >= m.min_move_m
                    || now - ts >= m.heartbeat
            }
        };
        let mut point = None;
        if make {
            self.motion.seq += 1;
            self.last = Some((self.motion.lat, self.motion.lon, now));
            let (lat, lon) = if self.plan.default_location {
                counts.default_location += 1;
                cfg.faults.default_at
            } else if cfg.faults.null_island > 0.0 && rng.random_bool(cfg.faults.null_island) {
                counts.null_island += 1;
                (0.0, 0.0)
            } else {
                (self.motion.lat, self.motion.lon)
            };
            point = Some(payload(&self.id, lat, lon, self.motion.ts, self.motion.seq));
        }

        if self.offline && self.plan.outage.is_some_and(|(_, to)| now >= to) {
            // Back online: the live point first, then the backlog in its original order.
            self.offline = false;
            out.extend([Action::Connect, Action::Online]);
            if let Some(p) = point.take() {
                out.push(Action::Send(p));
            }
            counts.flushed += self.buffer.len() as u64;
            out.extend(self.buffer.drain(..).map(Action::Flush));
        }
        if let Some(p) = point {
            if self.offline {
                if self.buffer.len() >= cfg.faults.buffer_max {
                    self.buffer.pop_front();
                    counts.buffer_dropped += 1;
                }
                self.buffer.push_back(p);
                counts.buffered += 1;
            } else {
                out.push(Action::Send(p));
            }
        }
        gap
    }
}

/// Points per second the configuration asks for, given how many couriers got each kind.
/// Exact for the fixed profile; for the mix an estimate (moving couriers send at each check,
/// standing ones at the heartbeat, checked at the next wake).
pub(crate) fn expected_rate(cfg: &SimConfig, kinds: &[(Kind, usize)]) -> f64 {
    kinds
        .iter()
        .map(|&(k, n)| {
            let n = n as f64;
            match (&cfg.profile, k) {
                (_, Kind::OffShift) => 0.0,
                (Profile::Fixed { interval }, _) => n / interval.as_secs_f64(),
                (Profile::Mix(m), k) => {
                    let ((a, b), still) = if k.delivering() {
                        (m.delivering_every, m.delivering_still)
                    } else {
                        (m.available_every, m.available_still)
                    };
                    let mean = (a + b) / 2.0;
                    n * ((1.0 - still) / mean + still / (m.heartbeat + mean / 2.0))
                }
            }
        })
        .sum()
}

/// The couriers that get an order (indices), preferring those on a delivery without faults:
/// a customer watches a courier who sends, so the delay is measured on a normal stream.
pub(crate) fn pick_order_couriers(phones: &[(Kind, bool)], k: usize) -> Vec<usize> {
    let tiers: [&dyn Fn(Kind, bool) -> bool; 4] = [
        &|kind, faulty| (kind.delivering() || kind == Kind::Fixed) && !faulty,
        &|kind, faulty| kind != Kind::OffShift && !faulty,
        &|kind, _| kind != Kind::OffShift,
        &|_, _| true,
    ];
    let mut picked = Vec::with_capacity(k);
    let mut taken = vec![false; phones.len()];
    for tier in tiers {
        for (i, &(kind, faulty)) in phones.iter().enumerate() {
            if picked.len() == k {
                return picked;
            }
            if !taken[i] && tier(kind, faulty) {
                taken[i] = true;
                picked.push(i);
            }
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Faults, Mix};
    use courier_wire::{decode_point, Validation};
    use proptest::prelude::*;
    use rand::{rngs::SmallRng, SeedableRng};
    use std::time::Duration;

    const T0: f64 = 1_764_460_800.0;

    fn fixed(interval: f64) -> SimConfig {
        SimConfig {
            profile: Profile::Fixed {
                interval: Duration::from_secs_f64(interval),
            },
            ..Default::default()
        }
    }

    /// Runs one phone from T0 for `secs`, returning every action with its wake time.
    fn run(
        phone: &mut Phone,
        cfg: &SimConfig,
        secs: f64,
        seed: u64,
    ) -> (Vec<(f64, Action)>, Counts) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = Vec::new();
        let mut counts = Counts::default();
        let mut actions = Vec::new();
        let Some(first) = phone.start(cfg, &mut rng, &mut out) else {
            return (actions, counts);
        };
        actions.extend(out.drain(..).map(|a| (T0, a)));
        let mut t = T0 + first;
        while t < T0 + secs {
            let gap = phone.wake(t, cfg, &mut rng, &mut out, &mut counts);
            actions.extend(out.drain(..).map(|a| (t, a)));
            t += gap;
        }
        (actions, counts)
    }

    fn decoded(a: &Action) -> Option<(bool, f64, u64, f64, f64)> {
        let (flush, bytes) = match a {
            Action::Send(b) => (false, b),
            Action::Flush(b) => (true, b),
            _ => return None,
        };
        let v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        Some((
            flush,
            v["ts"].as_f64().unwrap(),
            v["seq"].as_u64().unwrap(),
            v["lat"].as_f64().unwrap(),
            v["lon"].as_f64().unwrap(),
        ))
    }

    fn phone(cfg: &SimConfig, kind: Kind, plan: Plan) -> Phone {
        Phone::new(
            "c00001".into(),
            1,
            kind,
            plan,
            cfg,
            T0,
            &mut SmallRng::seed_from_u64(9),
        )
    }

    #[test]
    fn fixed_profile_sends_every_interval_with_growing_seq() {
        let cfg = fixed(4.0);
        let mut p = phone(&cfg, Kind::Fixed, Plan::default());
        let (actions, _) = run(&mut p, &cfg, 40.0, 1);
        assert_eq!(actions[0].1, Action::Connect);
        assert_eq!(actions[1].1, Action::Online);
        let points: Vec<_> = actions.iter().filter_map(|(_, a)| decoded(a)).collect();
        assert_eq!(points.len(), 10);
        for (k, w) in points.windows(2).enumerate() {
            assert_eq!(w[1].2, k as u64 + 2);
            assert!((w[1].1 - w[0].1 - 4.0).abs() < 0.002);
        }
        for (_, a) in &actions {
            if let Action::Send(b) = a {
                decode_point("c00001", b, T0 + 60.0, &Validation::default()).unwrap();
            }
        }
    }

    #[test]
    fn off_shift_sends_nothing_and_never_connects() {
        let cfg = SimConfig {
            profile: Profile::Mix(Mix::default()),
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::OffShift, Plan::default());
        assert!(run(&mut p, &cfg, 600.0, 2).0.is_empty());
    }

    #[test]
    fn standing_courier_sends_only_the_heartbeat() {
        let m = Mix {
            available_still: 1.0,
            ..Mix::default()
        };
        let cfg = SimConfig {
            profile: Profile::Mix(m.clone()),
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::Available, Plan::default());
        let (actions, _) = run(&mut p, &cfg, 600.0, 3);
        let ts: Vec<f64> = actions
            .iter()
            .filter_map(|(_, a)| decoded(a))
            .map(|d| d.1)
            .collect();
        assert!(
            ts.len() >= 600.0 as usize / 60 && ts.len() <= 600 / 30 + 1,
            "{}",
            ts.len()
        );
        for w in ts.windows(2) {
            let gap = w[1] - w[0];
            assert!(
                gap >= m.heartbeat - 0.002 && gap <= m.heartbeat + m.available_every.1,
                "{gap}"
            );
        }
    }

    #[test]
    fn moving_courier_on_delivery_sends_every_3_to_5_s() {
        let m = Mix {
            delivering_still: 0.0,
            ..Mix::default()
        };
        let cfg = SimConfig {
            profile: Profile::Mix(m),
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::ToCustomer, Plan::default());
        let (actions, _) = run(&mut p, &cfg, 300.0, 4);
        let ts: Vec<f64> = actions
            .iter()
            .filter_map(|(_, a)| decoded(a))
            .map(|d| d.1)
            .collect();
        for w in ts.windows(2) {
            let gap = w[1] - w[0];
            assert!((2.99..=5.01).contains(&gap), "{gap}");
        }
        assert!(ts.len() >= 300 / 5);
    }

    #[test]
    fn outage_buffers_then_flushes_after_the_live_point_with_original_ts_and_seq() {
        let cfg = fixed(1.0);
        let plan = Plan {
            outage: Some((T0 + 10.0, T0 + 20.0)),
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::Fixed, plan);
        let (actions, counts) = run(&mut p, &cfg, 30.0, 5);
        let drop_at = actions
            .iter()
            .position(|(_, a)| *a == Action::Drop)
            .unwrap();
        let back = actions
            .iter()
            .rposition(|(_, a)| *a == Action::Connect)
            .unwrap();
        assert!(actions[drop_at + 1..back]
            .iter()
            .all(|(_, a)| !matches!(a, Action::Send(_) | Action::Flush(_))));
        assert_eq!(actions[back + 1].1, Action::Online);
        let live = decoded(&actions[back + 2].1).unwrap();
        assert!(!live.0);
        let flushed: Vec<_> = actions[back + 3..]
            .iter()
            .filter_map(|(_, a)| decoded(a))
            .filter(|d| d.0)
            .collect();
        assert_eq!(flushed.len() as u64, counts.flushed);
        assert_eq!(counts.buffered, counts.flushed);
        assert!((9..=11).contains(&flushed.len()), "{}", flushed.len());
        for (k, f) in flushed.iter().enumerate() {
            assert!(
                f.2 < live.2 && f.1 < live.1,
                "a flushed point is older than the live one"
            );
            if k > 0 {
                assert_eq!(f.2, flushed[k - 1].2 + 1, "the backlog keeps its order");
            }
        }
        assert_eq!(flushed.last().unwrap().2 + 1, live.2);
    }

    #[test]
    fn offline_buffer_is_bounded_and_counts_what_it_drops() {
        let mut cfg = fixed(1.0);
        cfg.faults = Faults {
            buffer_max: 5,
            ..Default::default()
        };
        let plan = Plan {
            outage: Some((T0 + 1.0, T0 + 21.0)),
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::Fixed, plan);
        let (actions, counts) = run(&mut p, &cfg, 30.0, 6);
        assert_eq!(
            actions
                .iter()
                .filter(|(_, a)| matches!(a, Action::Flush(_)))
                .count(),
            5
        );
        assert_eq!(counts.buffered, counts.flushed + counts.buffer_dropped);
        assert!(counts.buffer_dropped >= 14);
    }

    #[test]
    fn restart_drops_the_connection_and_starts_seq_again() {
        let cfg = fixed(1.0);
        let plan = Plan {
            restart_at: Some(T0 + 10.5),
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::Fixed, plan);
        let (actions, counts) = run(&mut p, &cfg, 20.0, 7);
        assert_eq!(counts.restarts, 1);
        let d = actions
            .iter()
            .position(|(_, a)| *a == Action::Drop)
            .unwrap();
        assert_eq!(actions[d + 1].1, Action::Connect);
        assert_eq!(actions[d + 2].1, Action::Online);
        let seqs: Vec<u64> = actions
            .iter()
            .filter_map(|(_, a)| decoded(a))
            .map(|d| d.2)
            .collect();
        let reset = seqs.windows(2).position(|w| w[1] < w[0]).unwrap();
        assert_eq!(seqs[reset + 1], 1);
        assert!(seqs[reset] >= 9);
    }

    #[test]
    fn bad_gps_sends_null_island_or_the_shared_default() {
        let mut cfg = fixed(1.0);
        cfg.faults = Faults {
            null_island: 1.0,
            ..Default::default()
        };
        let mut p = phone(&cfg, Kind::Fixed, Plan::default());
        let (a, c) = run(&mut p, &cfg, 10.0, 8);
        let pts: Vec<_> = a.iter().filter_map(|(_, a)| decoded(a)).collect();
        assert!(pts.iter().all(|d| d.3 == 0.0 && d.4 == 0.0));
        assert_eq!(c.null_island, pts.len() as u64);

        let cfg = fixed(1.0);
        let mut p = phone(
            &cfg,
            Kind::Fixed,
            Plan {
                default_location: true,
                ..Default::default()
            },
        );
        let (a, _) = run(&mut p, &cfg, 10.0, 8);
        assert!(a
            .iter()
            .filter_map(|(_, a)| decoded(a))
            .all(|d| (d.3, d.4) == cfg.faults.default_at));
    }

    #[test]
    fn kinds_follow_the_mix_fractions() {
        let profile = Profile::Mix(Mix::default());
        let n = 10_000;
        let mut counts = std::collections::HashMap::new();
        for i in 0..n {
            *counts.entry(Kind::of(&profile, i)).or_insert(0usize) += 1;
        }
        for (k, f) in Kind::MIX.iter().zip(Mix::default().fractions()) {
            let share = counts[k] as f64 / n as f64;
            assert!((share - f).abs() < 0.002, "{k:?} {share}");
        }
    }

    #[test]
    fn expected_rate_of_the_fixed_profile_is_couriers_over_interval() {
        let cfg = fixed(4.0);
        assert_eq!(expected_rate(&cfg, &[(Kind::Fixed, 2000)]), 500.0);
    }

    #[test]
    fn order_couriers_prefer_deliveries_without_faults() {
        let phones = [
            (Kind::Available, false),
            (Kind::ToCustomer, true),
            (Kind::ToRestaurant, false),
            (Kind::OffShift, false),
            (Kind::ToCustomer, false),
        ];
        assert_eq!(pick_order_couriers(&phones, 2), vec![2, 4]);
        assert_eq!(pick_order_couriers(&phones, 4), vec![2, 4, 0, 1]);
        assert_eq!(pick_order_couriers(&phones, 9).len(), 5);
    }

    proptest! {
        #[test]
        fn every_point_sent_once_in_seq_order_per_epoch(seed: u64, outage_at in 0.0f64..50.0, len in 0.0f64..40.0, restart in proptest::option::of(0.0f64..60.0)) {
            let cfg = fixed(1.0);
            let plan = Plan { outage: Some((T0 + outage_at, T0 + outage_at + len)), restart_at: restart.map(|r| T0 + r), default_location: false };
            let mut p = phone(&cfg, Kind::Fixed, plan);
            let (actions, counts) = run(&mut p, &cfg, 60.0, seed);
            let pts: Vec<_> = actions.iter().filter_map(|(_, a)| decoded(a)).collect();
            // Nothing buffered is lost except what a restart wipes or is still offline at the end.
            prop_assert!(counts.flushed <= counts.buffered);
            prop_assert_eq!(counts.flushed as usize, pts.iter().filter(|d| d.0).count());
            // Every (epoch, seq) at most once; ts of live points never go back.
            let mut seen = std::collections::HashSet::new();
            let mut epoch = 0;
            let mut last_live: Option<(u64, f64)> = None;
            for d in &pts {
                if let Some((s, _)) = last_live { if !d.0 && d.2 <= s { epoch += 1; } }
                prop_assert!(seen.insert((epoch, d.2, d.0 as u8)));
                if !d.0 {
                    if let Some((_, t)) = last_live { prop_assert!(d.1 >= t); }
                    last_live = Some((d.2, d.1));
                }
            }
        }
    }
}
