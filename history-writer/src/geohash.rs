//! Geohash cells of the anonymous aggregates, from the integer grid PostgreSQL computes.
//!
//! A geohash of `n` characters bisects longitude and latitude alternately, `5n` bits in all,
//! longitude first. At 6 characters that is 15 bits each: the cell of a point is
//! `floor((lon + 180) / 360 * 2^15)` and `floor((lat + 90) / 180 * 2^15)`, which PostgreSQL
//! computes per row (two multiplications, no function call), and only the few cells that are
//! written get their 6-character name here.

/// Characters of the aggregate cells.
pub(crate) const PRECISION: usize = 6;
/// Bits of longitude (and of latitude) at [`PRECISION`].
pub(crate) const AXIS_BITS: u32 = (PRECISION as u32 * 5) / 2;
/// Cells per axis.
pub const CELLS_PER_AXIS: i64 = 1 << AXIS_BITS;

const BASE32: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";

/// The grid index of a coordinate on one axis of `span` degrees starting at `-span / 2`.
pub fn axis_index(v: f64, span: f64) -> i64 {
    (((v + span / 2.0) / span * CELLS_PER_AXIS as f64).floor() as i64).clamp(0, CELLS_PER_AXIS - 1)
}

/// The cell name of grid indices (`x` longitude, `y` latitude), or `None` outside the grid.
pub(crate) fn cell(x: i64, y: i64) -> Option<String> {
    if !(0..CELLS_PER_AXIS).contains(&x) || !(0..CELLS_PER_AXIS).contains(&y) {
        return None;
    }
    let mut bits: u64 = 0;
    for i in (0..AXIS_BITS).rev() {
        bits = (bits << 1) | ((x as u64 >> i) & 1);
        bits = (bits << 1) | ((y as u64 >> i) & 1);
    }
    let total = PRECISION as u32 * 5;
    Some(
        (0..PRECISION)
            .map(|c| {
                let shift = total - 5 * (c as u32 + 1);
                BASE32[((bits >> shift) & 31) as usize] as char
            })
            .collect(),
    )
}

/// The cell of a coordinate (the grid PostgreSQL uses, then [`cell`]).
pub fn encode(lat: f64, lon: f64) -> String {
    cell(axis_index(lon, 360.0), axis_index(lat, 180.0)).expect("indices are clamped")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_geohashes() {
        // Published examples: u4pruydqqvj (Jutland, from the geohash.org announcement) and
        // 6gkzwgjzn820 (Curitiba, Wikipedia's worked example), cut to 6 characters.
        assert_eq!(encode(57.64911, 10.40744), "u4pruy");
        assert_eq!(encode(-25.382708, -49.265506), "6gkzwg");
        assert_eq!(encode(0.0, 0.0), "s00000");
        assert_eq!(encode(-90.0, -180.0), "000000");
        assert_eq!(encode(90.0, 180.0), "zzzzzz");
    }

    #[test]
    fn out_of_grid_is_none() {
        assert_eq!(cell(-1, 0), None);
        assert_eq!(cell(0, CELLS_PER_AXIS), None);
        assert_eq!(cell(0, 0).as_deref(), Some("000000"));
    }
}
