//! Order events: their kinds (names webhook consumers depend on) and how one enters the Redis
//! events stream (`Keys::events`). Every script that causes an event writes it in the same
//! atomic call through [`EMIT_LUA`]'s `emit`, so an event exists exactly when its change does;
//! the notify role relays the stream into the PostgreSQL outbox (docs/events.md).

/// The kinds the pipeline emits.
pub const KINDS: &[&str] = &[
    ORDER_ASSIGNED,
    ORDER_PICKED_UP,
    ORDER_DELIVERED,
    ARRIVING_PICKUP,
    ARRIVING_DROPOFF,
    OFFLINE_DURING_ORDER,
];
/// The orders API bound a courier to the order.
pub(crate) const ORDER_ASSIGNED: &str = "order.assigned";
pub(crate) const ORDER_PICKED_UP: &str = "order.picked_up";
pub(crate) const ORDER_DELIVERED: &str = "order.delivered";
/// The courier's accepted point came within the arrival radius of the order's pickup place.
pub(crate) const ARRIVING_PICKUP: &str = "courier.arriving_pickup";
/// ... of its drop-off place.
pub(crate) const ARRIVING_DROPOFF: &str = "courier.arriving_dropoff";
/// The courier left the live index (a Last Will or his own `offline`, or silent past
/// `ingest.evict_after`) while carrying the order.
pub(crate) const OFFLINE_DURING_ORDER: &str = "courier.offline_during_order";

/// Lua, prepended to the scripts that emit: `emit(stream, dropped, cap, kind, key, order,
/// courier, tenant, at)`. The stream is bounded: past `cap` entries (the relay down or behind)
/// the event is counted in `dropped` instead; cap 0 writes nothing (no notify deployed).
pub(crate) const EMIT_LUA: &str = include_str!("emit.lua");

/// A script that emits: [`EMIT_LUA`] then `body`.
pub fn with_emit(body: &str) -> String {
    format!("{EMIT_LUA}{body}")
}

/// An order's places and which arrivals were reported, as `Keys::order_places` holds them:
/// `"<lat>,<lon>|<lat>,<lon>|<reported>"`: pickup, drop-off (either may be empty), then `p`
/// and/or `d` once `courier.arriving_pickup` / `_dropoff` was emitted (or, for `p`, the order
/// was picked up). Text so that the Lua scripts append a flag with one concatenation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Places {
    pub pickup: Option<(f64, f64)>,
    pub dropoff: Option<(f64, f64)>,
    pub pickup_reported: bool,
    pub dropoff_reported: bool,
}

impl Places {
    pub fn new(pickup: Option<(f64, f64)>, dropoff: Option<(f64, f64)>) -> Self {
        Places {
            pickup,
            dropoff,
            ..Default::default()
        }
    }

    /// The stored form; empty when the order has no place (nothing is stored then).
    pub fn encode(&self) -> String {
        if self.pickup.is_none() && self.dropoff.is_none() {
            return String::new();
        }
        // f64's Display is the shortest form that reads back exactly, never with an exponent.
        let place = |p: Option<(f64, f64)>| p.map_or(String::new(), |(a, o)| format!("{a},{o}"));
        let mut s = format!("{}|{}|", place(self.pickup), place(self.dropoff));
        if self.pickup_reported {
            s.push('p');
        }
        if self.dropoff_reported {
            s.push('d');
        }
        s
    }

    /// `None` for anything [`Places::encode`] (and the scripts' flag appends) cannot write.
    pub fn decode(s: &str) -> Option<Self> {
        let mut parts = s.splitn(3, '|');
        let place = |p: &str| -> Option<Option<(f64, f64)>> {
            if p.is_empty() {
                return Some(None);
            }
            let (a, o) = p.split_once(',')?;
            let (a, o) = (a.parse::<f64>().ok()?, o.parse::<f64>().ok()?);
            ((-90.0..=90.0).contains(&a) && (-180.0..=180.0).contains(&o)).then_some(Some((a, o)))
        };
        let pickup = place(parts.next()?)?;
        let dropoff = place(parts.next()?)?;
        let flags = parts.next()?;
        if !flags.bytes().all(|b| b == b'p' || b == b'd') {
            return None;
        }
        Some(Places {
            pickup,
            dropoff,
            pickup_reported: flags.contains('p'),
            dropoff_reported: flags.contains('d'),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn places_read_back_and_flags_append() {
        let p = Places::new(Some((24.7136, 46.6753)), None);
        assert_eq!(p.encode(), "24.7136,46.6753||");
        let appended = format!("{}d", p.encode());
        let back = Places::decode(&appended).unwrap();
        assert!(back.dropoff_reported && !back.pickup_reported);
        assert_eq!(back.pickup, Some((24.7136, 46.6753)));
        assert_eq!(Places::new(None, None).encode(), "");
        assert_eq!(Places::decode(""), None);
        assert_eq!(Places::decode("1,2|3,4|x"), None);
        assert_eq!(Places::decode("91,2||"), None);
        assert_eq!(
            Places::new(Some((0.00001, -0.5)), None).encode(),
            "0.00001,-0.5||"
        );
    }

    proptest! {
        #[test]
        fn every_encoded_places_decodes_to_itself(
            a in -90.0f64..=90.0, o in -180.0f64..=180.0, b in -90.0f64..=90.0, q in -180.0f64..=180.0,
            which in 0u8..3, p in any::<bool>(), d in any::<bool>()
        ) {
            let places = Places {
                pickup: (which != 1).then_some((a, o)),
                dropoff: (which != 0).then_some((b, q)),
                pickup_reported: p,
                dropoff_reported: d,
            };
            prop_assert_eq!(Places::decode(&places.encode()), Some(places));
        }
    }
}
