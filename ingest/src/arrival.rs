//! Arrival: whether a courier's accepted point reached a place of an order he carries. The
//! pure rule; the batch script hands ingest each order's places with the verdicts, and
//! `arrive.lua` writes the events (once per order and place).
//!
//! | place                        | an arrival when                                          |
//! |------------------------------|----------------------------------------------------------|
//! | pickup, not yet reported     | the point is within `radius - margin` of it               |
//! | drop-off, not yet reported   | the same                                                 |
//! | reported (or pickup after `picked_up`) | never again                                    |
//!
//! The margin is the hysteresis band: a courier whose fixes wander around the radius (GPS
//! jitter of a courier waiting outside, ±`margin`) triggers nothing; one who comes in does,
//! once. Distance is the haversine great-circle distance (mean Earth radius), exact to well
//! under a metre at these ranges.

use courier_wire::events::Places;

const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// Metres between two (lat, lon) in degrees.
pub(crate) fn distance_m(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (la, lb) = (a.0.to_radians(), b.0.to_radians());
    let dlat = lb - la;
    let dlon = (b.1 - a.1).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + la.cos() * lb.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_M * h.sqrt().min(1.0).asin()
}

/// The arrival settings, in metres.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub radius_m: f64,
    pub margin_m: f64,
}

/// Which place of an order a point arrived at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Pickup,
    Dropoff,
}

impl Place {
    /// The flag `arrive.lua` and `order:places` use.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Place::Pickup => "p",
            Place::Dropoff => "d",
        }
    }
}

impl Rule {
    /// The places of `places` that the point `at` arrives at now (none, one or both).
    pub fn arrivals(&self, at: (f64, f64), places: &Places) -> impl Iterator<Item = Place> {
        let inside = self.radius_m - self.margin_m;
        let hit = |p: Option<(f64, f64)>, reported: bool| {
            !reported && p.is_some_and(|p| distance_m(at, p) <= inside)
        };
        let pickup = hit(places.pickup, places.pickup_reported).then_some(Place::Pickup);
        let dropoff = hit(places.dropoff, places.dropoff_reported).then_some(Place::Dropoff);
        pickup.into_iter().chain(dropoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RULE: Rule = Rule {
        radius_m: 150.0,
        margin_m: 30.0,
    };

    /// A point `m` metres north of `p`.
    fn north(p: (f64, f64), m: f64) -> (f64, f64) {
        (p.0 + (m / EARTH_RADIUS_M).to_degrees(), p.1)
    }

    #[test]
    fn distances() {
        // Riyadh to Jeddah, about 845 km; one degree of latitude, about 111.2 km.
        let d = distance_m((24.7136, 46.6753), (21.4858, 39.1925));
        assert!((d - 845_000.0).abs() < 5_000.0, "{d}");
        assert!((distance_m((0.0, 10.0), (1.0, 10.0)) - 111_195.0).abs() < 2.0);
        assert_eq!(distance_m((24.7, 46.6), (24.7, 46.6)), 0.0);
    }

    #[test]
    fn the_rule_table() {
        let shop = (24.7136, 46.6753);
        let home = (24.80, 46.70);
        let p = Places::new(Some(shop), Some(home));
        let at = |m| RULE.arrivals(north(shop, m), &p).collect::<Vec<_>>();
        assert_eq!(at(0.0), [Place::Pickup]);
        assert_eq!(at(119.0), [Place::Pickup]);
        assert_eq!(at(121.0), []);
        assert_eq!(
            at(150.0),
            [],
            "on the radius itself: inside the band, nothing"
        );
        let reported = Places {
            pickup_reported: true,
            ..p
        };
        assert_eq!(RULE.arrivals(shop, &reported).count(), 0);
        assert_eq!(
            RULE.arrivals(home, &reported).collect::<Vec<_>>(),
            [Place::Dropoff]
        );
        let none = Places::new(None, None);
        assert_eq!(RULE.arrivals(shop, &none).count(), 0);
    }

    proptest! {
        /// GPS jitter of ±margin around the radius never arrives.
        #[test]
        fn jitter_around_the_radius_never_arrives(off in -29.9f64..29.9, bearing in 0.0f64..360.0) {
            let shop = (24.7136, 46.6753);
            let m = 150.0 + off;
            let b = bearing.to_radians();
            let lat = shop.0 + (m * b.cos() / EARTH_RADIUS_M).to_degrees();
            let lon = shop.1 + (m * b.sin() / (EARTH_RADIUS_M * shop.0.to_radians().cos())).to_degrees();
            prop_assert_eq!(RULE.arrivals((lat, lon), &Places::new(Some(shop), None)).count(), 0);
        }
    }
}
