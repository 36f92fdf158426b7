//! The `track/{order}` payload: `{"lat","lon","ts"}` of the courier carrying the order.

/// Encodes the payload a customer receives. Nothing but position and phone time: no courier id,
/// no seq.
pub fn encode_track(lat: f64, lon: f64, ts: f64) -> Vec<u8> {
    let mut b = ryu::Buffer::new();
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"{\"lat\":");
    out.extend_from_slice(b.format_finite(lat).as_bytes());
    out.extend_from_slice(b",\"lon\":");
    out.extend_from_slice(b.format_finite(lon).as_bytes());
    out.extend_from_slice(b",\"ts\":");
    out.extend_from_slice(b.format_finite(ts).as_bytes());
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_json() {
        let bytes = encode_track(24.7136, 46.6753, 1_764_460_800.25);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["lat"].as_f64(), Some(24.7136));
        assert_eq!(v["lon"].as_f64(), Some(46.6753));
        assert_eq!(v["ts"].as_f64(), Some(1_764_460_800.25));
        assert_eq!(v.as_object().unwrap().len(), 3);
    }
}
