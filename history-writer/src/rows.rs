//! Pure: a received message becomes a COPY row, or a counted refusal. Validation is
//! `courier_wire::decode_point`, the same code and limits as ingest. Out-of-order and duplicate
//! points ARE rows: history keeps everything valid; the trail read removes duplicates.

use courier_wire::{decode_point, parse_courier_topic, CourierTopic, Invalid, Validation};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One row of `courier_points`. About 72 B plus the id on the heap.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub courier_id: Box<str>,
    pub seq: i64,
    /// The phone's clock, unix seconds.
    pub phone_ts: f64,
    /// The server's receive time, unix seconds.
    pub received_at: f64,
    /// The orders the courier carried when the point arrived, as `courier:order` holds them
    /// (comma-separated; [`running_orders`] splits them).
    pub order_id: Option<Arc<str>>,
    pub lat: f64,
    pub lon: f64,
}

/// Why a message did not become a row. [`Refused::reason`] is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not `couriers/{valid id}/loc` (a broker or a misconfigured filter delivered it).
    Topic,
    Invalid(Invalid),
}

impl Refused {
    /// Every reason, in a fixed order (for per-reason counters).
    pub(crate) const COUNT: usize = Invalid::ALL.len() + 1;

    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refused::Topic => "bad_topic",
            Refused::Invalid(i) => i.reason(),
        }
    }

    /// Position in `0..COUNT`.
    pub(crate) fn index(self) -> usize {
        match self {
            Refused::Topic => Invalid::ALL.len(),
            Refused::Invalid(i) => i.index(),
        }
    }

    /// The reason of each index.
    pub(crate) fn all() -> impl Iterator<Item = Refused> {
        Invalid::ALL
            .iter()
            .map(|i| Refused::Invalid(*i))
            .chain([Refused::Topic])
    }
}

/// The orders of a `courier:order` value (comma-separated, oldest first: stacked deliveries).
pub(crate) fn running_orders(value: &str) -> Vec<&str> {
    value.split(',').filter(|o| !o.is_empty()).collect()
}

/// Courier id -> order id, a snapshot of `courier:order`.
pub(crate) type Orders = HashMap<String, Arc<str>>;

/// Validates one message received at `received` (unix seconds) and stamps the courier's
/// current order from `orders`.
pub(crate) fn row(
    topic: &str,
    payload: &[u8],
    received: f64,
    limits: &Validation,
    orders: &Orders,
) -> Result<Row, Refused> {
    let Some(CourierTopic::Loc(id)) = parse_courier_topic(topic) else {
        return Err(Refused::Topic);
    };
    let p = decode_point(id, payload, received, limits).map_err(Refused::Invalid)?;
    Ok(Row {
        courier_id: p.id.into(),
        // decode_point bounds seq by 2^53.
        seq: p.seq as i64,
        phone_ts: p.ts,
        received_at: received,
        order_id: orders.get(p.id).cloned(),
        lat: p.lat,
        lon: p.lon,
    })
}

/// Unix seconds as the `SystemTime` tokio-postgres encodes as `timestamptz`.
pub fn system_time(unix: f64) -> SystemTime {
    // Whole microseconds, PostgreSQL's resolution, rounded rather than truncated.
    let micros = (unix.abs() * 1e6).round() as u64;
    if unix >= 0.0 {
        UNIX_EPOCH + Duration::from_micros(micros)
    } else {
        UNIX_EPOCH - Duration::from_micros(micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 1_764_460_800.0;

    fn orders() -> Orders {
        HashMap::from([("c1".to_string(), Arc::<str>::from("o-77"))])
    }

    #[test]
    fn stacked_orders_split_oldest_first() {
        assert_eq!(running_orders("o-1,o-2"), ["o-1", "o-2"]);
        assert_eq!(running_orders("o-1"), ["o-1"]);
        assert!(running_orders("").is_empty());
    }

    #[test]
    fn a_valid_point_becomes_a_row_with_its_order() {
        let r = row(
            "couriers/c1/loc",
            br#"{"id":"c1","lat":24.7,"lon":46.6,"ts":1764460790.5,"seq":9}"#,
            NOW,
            &Validation::default(),
            &orders(),
        )
        .unwrap();
        assert_eq!(&*r.courier_id, "c1");
        assert_eq!((r.seq, r.phone_ts, r.received_at), (9, 1764460790.5, NOW));
        assert_eq!(r.order_id.as_deref(), Some("o-77"));
        assert_eq!((r.lat, r.lon), (24.7, 46.6));
        let r = row(
            "couriers/c2/loc",
            br#"{"id":"c2","lat":1,"lon":2,"ts":5,"seq":1}"#,
            NOW,
            &Validation::default(),
            &orders(),
        )
        .unwrap();
        assert_eq!(r.order_id, None, "no order: NULL");
    }

    #[test]
    fn refusals_carry_the_ingest_reason() {
        let v = Validation::default();
        let r = |t: &str, p: &str| row(t, p.as_bytes(), NOW, &v, &orders()).unwrap_err();
        assert_eq!(r("couriers/c1/status", "{}"), Refused::Topic);
        assert_eq!(r("couriers/c1/loc", "nope").reason(), "not_json");
        assert_eq!(
            r(
                "couriers/c1/loc",
                r#"{"id":"c2","lat":1,"lon":2,"ts":5,"seq":1}"#
            )
            .reason(),
            "id_mismatch"
        );
        assert_eq!(
            r(
                "couriers/c1/loc",
                r#"{"id":"c1","lat":0,"lon":0,"ts":5,"seq":1}"#
            )
            .reason(),
            "null_island"
        );
        let reasons: Vec<_> = Refused::all().map(|x| (x.index(), x.reason())).collect();
        assert_eq!(reasons.len(), Refused::COUNT);
        assert!(reasons.iter().enumerate().all(|(i, (j, _))| i == *j));
    }

    #[test]
    fn system_time_keeps_microseconds() {
        let t = system_time(1_764_460_800.123456);
        let back = t.duration_since(UNIX_EPOCH).unwrap().as_micros();
        assert_eq!(back, 1_764_460_800_123_456);
    }
}
