//! The query and its answer, with no I/O: settings checked once, the script's reply parsed.

use crate::DispatchError;
use std::time::Duration;

/// Most members one ring search looks at when stale couriers crowd it.
pub(crate) const FETCH_MAX: usize = 4096;

/// "The `count` nearest couriers seen within `max_age` of (`lat`, `lon`)".
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub lat: f64,
    pub lon: f64,
    pub count: usize,
    /// Ring radii in km, ascending: the search widens ring by ring until `count` are found.
    pub radii_km: Vec<f64>,
    /// Couriers whose last point is older are skipped.
    pub max_age: Duration,
    /// Stop at the first `count` found in a ring instead of the nearest `count` (hot spots).
    pub any: bool,
}

impl Query {
    /// A query with the default rings (0.5, 1, 2, 5 km), 10 couriers, 30 s max age.
    pub fn at(lat: f64, lon: f64) -> Query {
        Query {
            lat,
            lon,
            count: 10,
            radii_km: vec![0.5, 1.0, 2.0, 5.0],
            max_age: Duration::from_secs(30),
            any: false,
        }
    }

    /// Checks the query; the error names what is wrong.
    pub fn validate(&self) -> Result<(), DispatchError> {
        let bad = |m: &str| Err(DispatchError::Query(m.to_string()));
        if !(self.lat.is_finite() && self.lat.abs() <= courier_wire::point::MAX_LAT) {
            return bad("lat out of range");
        }
        if !(self.lon.is_finite() && self.lon.abs() <= 180.0) {
            return bad("lon out of range");
        }
        if self.count == 0 || self.count > FETCH_MAX {
            return bad("count must be within 1..=4096");
        }
        if self.radii_km.is_empty() {
            return bad("at least one ring radius");
        }
        if self.radii_km.iter().any(|r| !(r.is_finite() && *r > 0.0))
            || self.radii_km.windows(2).any(|w| w[1] <= w[0])
        {
            return bad("ring radii must be positive and ascending");
        }
        Ok(())
    }
}

/// Parses `0.5,1,2,5` (km).
pub fn parse_radii(text: &str) -> Result<Vec<f64>, String> {
    text.split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .map_err(|_| format!("ring radius {p:?} is not a number"))
        })
        .collect()
}

/// One courier found.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub id: String,
    pub dist_km: f64,
    /// Time of his last accepted point (unix seconds, server clock).
    pub seen: f64,
}

/// The answer: couriers nearest first, and the ring that held enough.
#[derive(Debug, Clone, PartialEq)]
pub struct Nearest {
    /// Index into `radii_km` of the ring that held `count` fresh couriers; `None` when even the
    /// widest did not (then `couriers` holds what the widest ring had).
    pub ring: Option<usize>,
    pub couriers: Vec<Found>,
}

/// Parses the script's reply `{ring, id, dist, seen, id, dist, seen, ...}` (strings, ring as
/// an integer).
pub(crate) fn parse_reply(
    ring: i64,
    rest: &[String],
    rings: usize,
) -> Result<Nearest, DispatchError> {
    if rest.len() % 3 != 0 {
        return Err(DispatchError::Reply(format!(
            "{} values after the ring, not triples",
            rest.len()
        )));
    }
    if ring < 0 || ring as usize > rings {
        return Err(DispatchError::Reply(format!("ring {ring} of {rings}")));
    }
    let num = |s: &str| {
        s.parse::<f64>()
            .map_err(|_| DispatchError::Reply(format!("not a number: {s:?}")))
    };
    let couriers = rest
        .chunks(3)
        .map(|c| {
            Ok(Found {
                id: c[0].clone(),
                dist_km: num(&c[1])?,
                seen: num(&c[2])?,
            })
        })
        .collect::<Result<Vec<_>, DispatchError>>()?;
    Ok(Nearest {
        ring: (ring > 0).then(|| ring as usize - 1),
        couriers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_query_is_valid_and_bad_ones_name_the_fault() {
        Query::at(24.7114, 46.6744).validate().unwrap();
        let e = |q: Query| q.validate().unwrap_err().to_string();
        assert!(e(Query {
            count: 0,
            ..Query::at(0.0, 0.0)
        })
        .contains("count"));
        assert!(e(Query {
            radii_km: vec![],
            ..Query::at(0.0, 0.0)
        })
        .contains("radius"));
        assert!(e(Query {
            radii_km: vec![1.0, 0.5],
            ..Query::at(0.0, 0.0)
        })
        .contains("ascending"));
        assert!(e(Query {
            lat: 91.0,
            ..Query::at(0.0, 0.0)
        })
        .contains("lat"));
        assert!(e(Query {
            lon: f64::NAN,
            ..Query::at(0.0, 0.0)
        })
        .contains("lon"));
    }

    #[test]
    fn radii_parse() {
        assert_eq!(parse_radii("0.5, 1,2,5").unwrap(), vec![0.5, 1.0, 2.0, 5.0]);
        assert!(parse_radii("1,x").is_err());
    }

    #[test]
    fn replies_parse_and_garbage_is_an_error() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let n = parse_reply(2, &s(&["c1", "0.0620", "1764460800.5"]), 4).unwrap();
        assert_eq!(n.ring, Some(1));
        assert_eq!(
            n.couriers[0],
            Found {
                id: "c1".into(),
                dist_km: 0.062,
                seen: 1_764_460_800.5
            }
        );
        assert_eq!(
            parse_reply(0, &[], 4).unwrap(),
            Nearest {
                ring: None,
                couriers: vec![]
            }
        );
        assert!(parse_reply(1, &s(&["c1", "0.1"]), 4).is_err());
        assert!(parse_reply(1, &s(&["c1", "x", "1"]), 4).is_err());
        assert!(parse_reply(5, &[], 4).is_err());
    }

    proptest! {
        #[test]
        fn ascending_positive_radii_are_valid(mut r in proptest::collection::vec(0.01f64..100.0, 1..6)) {
            r.sort_by(f64::total_cmp);
            r.dedup();
            let q = Query { radii_km: r, ..Query::at(24.7, 46.7) };
            prop_assert!(q.validate().is_ok());
        }

        #[test]
        fn any_reply_string_never_panics(ring in -3i64..8, rest in proptest::collection::vec(".{0,8}", 0..10)) {
            let _ = parse_reply(ring, &rest, 4);
        }
    }
}
