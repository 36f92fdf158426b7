//! How a simulated courier moves, and the payload he sends. Pure: no clock, no network.

use rand::Rng;

/// A latitude/longitude rectangle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BBox {
    pub lat_min: f64,
    pub lat_max: f64,
    pub lon_min: f64,
    pub lon_max: f64,
}

impl BBox {
    /// The reference article's Riyadh rectangle.
    pub(crate) const RIYADH: BBox = BBox {
        lat_min: 24.60,
        lat_max: 24.85,
        lon_min: 46.55,
        lon_max: 46.85,
    };

    #[cfg(test)]
    fn contains(&self, lat: f64, lon: f64) -> bool {
        (self.lat_min..=self.lat_max).contains(&lat) && (self.lon_min..=self.lon_max).contains(&lon)
    }
}

/// About 30 km/h.
pub(crate) const SPEED_M_PER_S: f64 = 30_000.0 / 3600.0;
const M_PER_DEG_LAT: f64 = 111_320.0;

/// One courier's position, heading, phone clock of the last point and seq.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Courier {
    pub lat: f64,
    pub lon: f64,
    /// Radians, 0 = north.
    pub heading: f64,
    pub ts: f64,
    pub seq: u64,
}

impl Courier {
    pub(crate) fn new(bbox: BBox, rng: &mut impl Rng, now: f64) -> Self {
        Courier {
            lat: rng.random_range(bbox.lat_min..bbox.lat_max),
            lon: rng.random_range(bbox.lon_min..bbox.lon_max),
            heading: rng.random_range(0.0..std::f64::consts::TAU),
            ts: now,
            seq: 0,
        }
    }

    /// Moves for the time since the last point, turning a little and bouncing off the box, and
    /// makes the next point (seq + 1). The phones use `travel` and [`payload`]; the tests here
    /// walk a courier with this.
    #[cfg(test)]
    fn advance(&mut self, now: f64, rng: &mut impl Rng, bbox: BBox) -> &mut Self {
        self.travel(now, SPEED_M_PER_S, rng, bbox);
        self.seq += 1;
        self
    }

    /// Moves at `speed` (m/s; 0 = standing) for the time since `ts`, then sets `ts = now`;
    /// seq is unchanged (a phone that moves without sending).
    pub(crate) fn travel(&mut self, now: f64, speed: f64, rng: &mut impl Rng, bbox: BBox) {
        let dt = (now - self.ts).clamp(0.0, 60.0);
        self.ts = now.max(self.ts);
        if speed <= 0.0 || dt == 0.0 {
            return;
        }
        self.heading += rng.random_range(-0.3..0.3);
        let d = speed * dt;
        let mut lat = self.lat + d * self.heading.cos() / M_PER_DEG_LAT;
        let mut lon =
            self.lon + d * self.heading.sin() / (M_PER_DEG_LAT * self.lat.to_radians().cos());
        if !(bbox.lat_min..=bbox.lat_max).contains(&lat) {
            self.heading = std::f64::consts::PI - self.heading;
            lat = lat.clamp(bbox.lat_min, bbox.lat_max);
        }
        if !(bbox.lon_min..=bbox.lon_max).contains(&lon) {
            self.heading = -self.heading;
            lon = lon.clamp(bbox.lon_min, bbox.lon_max);
        }
        self.lat = lat;
        self.lon = lon;
    }

    /// `{"id","lat","lon","ts","seq"}` with the phone time to the millisecond, as apps send it.
    #[cfg(test)]
    fn payload(&self, id: &str) -> Vec<u8> {
        payload(id, self.lat, self.lon, self.ts, self.seq)
    }
}

/// Metres between two nearby points (equirectangular; exact enough within a city).
pub(crate) fn distance_m(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let dy = (lat2 - lat1) * M_PER_DEG_LAT;
    let dx = (lon2 - lon1) * M_PER_DEG_LAT * ((lat1 + lat2) / 2.0).to_radians().cos();
    (dx * dx + dy * dy).sqrt()
}

/// A point payload: coordinates to 6 decimals (about 0.1 m), phone time to the millisecond.
pub(crate) fn payload(id: &str, lat: f64, lon: f64, ts: f64, seq: u64) -> Vec<u8> {
    let mut f = ryu::Buffer::new();
    let mut out = Vec::with_capacity(96);
    out.extend_from_slice(b"{\"id\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",\"lat\":");
    out.extend_from_slice(f.format_finite((lat * 1e6).round() / 1e6).as_bytes());
    out.extend_from_slice(b",\"lon\":");
    out.extend_from_slice(f.format_finite((lon * 1e6).round() / 1e6).as_bytes());
    out.extend_from_slice(b",\"ts\":");
    out.extend_from_slice(f.format_finite((ts * 1e3).round() / 1e3).as_bytes());
    out.extend_from_slice(b",\"seq\":");
    push_u64(&mut out, seq);
    out.push(b'}');
    out
}

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_wire::{decode_point, Validation};
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn stays_in_the_box_and_moves_at_about_30_kmh() {
        let mut rng = SmallRng::seed_from_u64(1);
        let b = BBox::RIYADH;
        let mut c = Courier::new(b, &mut rng, 1000.0);
        for i in 1..=5000 {
            let (lat0, lon0) = (c.lat, c.lon);
            c.advance(1000.0 + 4.0 * i as f64, &mut rng, b);
            assert!(b.contains(c.lat, c.lon));
            let dy = (c.lat - lat0) * M_PER_DEG_LAT;
            let dx = (c.lon - lon0) * M_PER_DEG_LAT * c.lat.to_radians().cos();
            assert!((dx * dx + dy * dy).sqrt() <= SPEED_M_PER_S * 4.0 * 1.01);
        }
        assert_eq!(c.seq, 5000);
    }

    #[test]
    fn payload_is_a_valid_point() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut c = Courier::new(BBox::RIYADH, &mut rng, 1_764_460_800.0);
        c.advance(1_764_460_804.123_456, &mut rng, BBox::RIYADH);
        let bytes = c.payload("c00007");
        let p = decode_point("c00007", &bytes, 1_764_460_805.0, &Validation::default()).unwrap();
        assert_eq!(p.seq, 1);
        assert_eq!(p.ts, 1_764_460_804.123);
        assert!(bytes.len() < 100);
    }
}
