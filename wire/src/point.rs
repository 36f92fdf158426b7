//! The point a courier's phone publishes on `couriers/{id}/loc`, and its validation.
//!
//! `{"id":"c00042","lat":24.7136,"lon":46.6753,"ts":1764460800.25,"seq":1842}`: `ts` is the
//! phone's clock in unix seconds (may be fractional), `seq` grows with every point. Unknown
//! fields are ignored so that apps can add fields without breaking older servers.

use serde::Deserialize;

/// Largest latitude Redis GEO stores (the Web Mercator limit). A point beyond it could not
/// become a live location, so it is refused at the door rather than failing a whole batch.
pub const MAX_LAT: f64 = 85.051_128_78;
/// Largest seq the batch script compares exactly (Lua numbers are doubles).
pub(crate) const MAX_SEQ: u64 = 1 << 53;

/// Limits applied to every point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validation {
    /// Payloads longer than this are refused unread.
    pub max_payload_bytes: usize,
    /// How far (seconds) the phone clock may run ahead of the server's.
    pub max_future_skew_secs: f64,
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            max_payload_bytes: 512,
            max_future_skew_secs: 300.0,
        }
    }
}

/// Why a payload was refused. [`Invalid::reason`] is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Invalid {
    #[error("payload larger than the configured limit")]
    Oversize,
    #[error("payload is not a JSON object")]
    NotJson,
    #[error("a required field (id, lat, lon, ts, seq) is missing")]
    MissingField,
    #[error("a field has the wrong type")]
    BadType,
    #[error("courier id is empty, too long or has characters outside [A-Za-z0-9._:-]")]
    BadId,
    #[error("lat, lon, ts or seq out of range")]
    OutOfRange,
    #[error("exactly (0,0): a GPS fix that never happened")]
    NullIsland,
    #[error("payload id differs from the topic's id")]
    IdMismatch,
    #[error("ts too far in the future")]
    FutureTs,
}

impl Invalid {
    /// Every reason, in a fixed order (for per-reason counters).
    pub const ALL: [Invalid; 9] = [
        Invalid::Oversize,
        Invalid::NotJson,
        Invalid::MissingField,
        Invalid::BadType,
        Invalid::BadId,
        Invalid::OutOfRange,
        Invalid::NullIsland,
        Invalid::IdMismatch,
        Invalid::FutureTs,
    ];

    /// The `reason` label of `ingest_invalid_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Invalid::Oversize => "oversize",
            Invalid::NotJson => "not_json",
            Invalid::MissingField => "missing_field",
            Invalid::BadType => "bad_type",
            Invalid::BadId => "bad_id",
            Invalid::OutOfRange => "out_of_range",
            Invalid::NullIsland => "null_island",
            Invalid::IdMismatch => "id_mismatch",
            Invalid::FutureTs => "future_ts",
        }
    }

    /// Position in [`Invalid::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A validated point, borrowing its id from the payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Point<'a> {
    pub id: &'a str,
    pub lat: f64,
    pub lon: f64,
    /// Phone clock, unix seconds.
    pub ts: f64,
    pub seq: u64,
}

#[derive(Deserialize)]
struct Raw<'a> {
    // Borrowed: an id with JSON escapes is refused as bad_type, never a valid id anyway.
    id: Option<&'a str>,
    lat: Option<f64>,
    lon: Option<f64>,
    ts: Option<f64>,
    seq: Option<u64>,
}

/// Decodes and validates one payload received on `couriers/{topic_id}/loc`. `now` is the
/// server's clock in unix seconds. Never panics, whatever the bytes.
pub fn decode_point<'a>(
    topic_id: &str,
    payload: &'a [u8],
    now: f64,
    limits: &Validation,
) -> Result<Point<'a>, Invalid> {
    if payload.len() > limits.max_payload_bytes {
        return Err(Invalid::Oversize);
    }
    // serde's derive also accepts a JSON array for a struct; a point is an object.
    match payload.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        _ => return Err(Invalid::NotJson),
    }
    let raw: Raw<'a> = serde_json::from_slice(payload).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Invalid::BadType,
        _ => Invalid::NotJson,
    })?;
    let (Some(id), Some(lat), Some(lon), Some(ts), Some(seq)) =
        (raw.id, raw.lat, raw.lon, raw.ts, raw.seq)
    else {
        return Err(Invalid::MissingField);
    };
    if !crate::topic::valid_id(id) {
        return Err(Invalid::BadId);
    }
    if id != topic_id {
        return Err(Invalid::IdMismatch);
    }
    if !(lat.is_finite() && lon.is_finite() && ts.is_finite())
        || lat.abs() > MAX_LAT
        || lon.abs() > 180.0
        || ts <= 0.0
        || seq > MAX_SEQ
    {
        return Err(Invalid::OutOfRange);
    }
    if lat == 0.0 && lon == 0.0 {
        return Err(Invalid::NullIsland);
    }
    if ts > now + limits.max_future_skew_secs {
        return Err(Invalid::FutureTs);
    }
    Ok(Point {
        id,
        lat,
        lon,
        ts,
        seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: f64 = 1_764_460_800.0;

    fn check(topic_id: &str, payload: &str) -> Result<Point<'static>, Invalid> {
        let leaked: &'static [u8] = Box::leak(payload.as_bytes().to_vec().into_boxed_slice());
        decode_point(topic_id, leaked, NOW, &Validation::default())
    }

    #[test]
    fn accepts_a_good_point() {
        let p = check(
            "c1",
            r#"{"id":"c1","lat":24.7136,"lon":46.6753,"ts":1764460799.5,"seq":7,"acc":5}"#,
        )
        .unwrap();
        assert_eq!(p.id, "c1");
        assert_eq!(
            (p.lat, p.lon, p.ts, p.seq),
            (24.7136, 46.6753, 1764460799.5, 7)
        );
    }

    #[test]
    fn integer_coordinates_and_ts_are_numbers_too() {
        let p = check(
            "c1",
            r#"{"id":"c1","lat":24,"lon":46,"ts":1764460799,"seq":0}"#,
        )
        .unwrap();
        assert_eq!((p.lat, p.lon, p.ts, p.seq), (24.0, 46.0, 1764460799.0, 0));
    }

    #[test]
    fn refuses_each_kind_of_nonsense_with_its_reason() {
        let cases: &[(&str, Invalid)] = &[
            ("", Invalid::NotJson),
            ("not json", Invalid::NotJson),
            ("[\"c1\",1,2,3,4]", Invalid::NotJson),
            ("{\"id\":\"c1\"", Invalid::NotJson),
            (
                "{\"id\":\"c1\",\"lat\":NaN,\"lon\":1,\"ts\":1,\"seq\":1}",
                Invalid::NotJson,
            ),
            (
                r#"{"lat":1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::MissingField,
            ),
            (
                r#"{"id":"c1","lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::MissingField,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":1764460799}"#,
                Invalid::MissingField,
            ),
            (
                r#"{"id":"c1","lat":"24.7","lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::BadType,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":1764460799,"seq":-1}"#,
                Invalid::BadType,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":1764460799,"seq":1.5}"#,
                Invalid::BadType,
            ),
            (
                r#"{"id":7,"lat":1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::BadType,
            ),
            (
                r#"{"id":null,"lat":1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::MissingField,
            ),
            (
                r#"{"id":"c 1","lat":1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::BadId,
            ),
            (
                r#"{"id":"","lat":1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::BadId,
            ),
            (
                r#"{"id":"c2","lat":1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::IdMismatch,
            ),
            (
                r#"{"id":"c1","lat":91,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::OutOfRange,
            ),
            (
                r#"{"id":"c1","lat":85.1,"lon":1,"ts":1764460799,"seq":1}"#,
                Invalid::OutOfRange,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":-180.5,"ts":1764460799,"seq":1}"#,
                Invalid::OutOfRange,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":-5,"seq":1}"#,
                Invalid::OutOfRange,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":1764460799,"seq":9007199254740993}"#,
                Invalid::OutOfRange,
            ),
            (
                r#"{"id":"c1","lat":0,"lon":0,"ts":1764460799,"seq":1}"#,
                Invalid::NullIsland,
            ),
            (
                r#"{"id":"c1","lat":0.0,"lon":-0.0,"ts":1764460799,"seq":1}"#,
                Invalid::NullIsland,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":1764461200,"seq":1}"#,
                Invalid::FutureTs,
            ),
            (
                r#"{"id":"c1","lat":1,"lon":1,"ts":1764460800000,"seq":1}"#,
                Invalid::FutureTs,
            ),
        ];
        for (payload, want) in cases {
            assert_eq!(check("c1", payload), Err(*want), "{payload}");
        }
    }

    #[test]
    fn huge_exponents_are_refused() {
        let r = check(
            "c1",
            r#"{"id":"c1","lat":1e999,"lon":1,"ts":1764460799,"seq":1}"#,
        );
        assert!(r.is_err());
    }

    #[test]
    fn oversize_is_refused_before_parsing() {
        let big = format!(
            r#"{{"id":"c1","lat":1,"lon":1,"ts":1764460799,"seq":1,"pad":"{}"}}"#,
            "x".repeat(600)
        );
        assert_eq!(check("c1", &big), Err(Invalid::Oversize));
    }

    #[test]
    fn reasons_are_distinct_and_indexed() {
        let mut seen = std::collections::HashSet::new();
        for (i, r) in Invalid::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert!(seen.insert(r.reason()));
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
            let _ = decode_point("c1", &bytes, NOW, &Validation::default());
        }

        #[test]
        fn valid_points_round_trip(
            lat in -85.0f64..85.0, lon in -180.0f64..180.0,
            ts in 1.0f64..NOW, seq in 0u64..MAX_SEQ,
        ) {
            prop_assume!(!(lat == 0.0 && lon == 0.0));
            let payload = serde_json::json!({"id":"c9","lat":lat,"lon":lon,"ts":ts,"seq":seq}).to_string();
            let p = decode_point("c9", payload.as_bytes(), NOW, &Validation::default()).unwrap();
            prop_assert_eq!((p.lat, p.lon, p.ts, p.seq), (lat, lon, ts, seq));
        }
    }
}
