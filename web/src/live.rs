//! The pure core of the operations map: the view's bounding box and the Redis box that covers
//! it, the colour of a courier by the age of his last point, grid clusters past the marker cap,
//! and the packed seq state a courier's card shows. No I/O: `api.rs` does the Redis calls.

use serde::Serialize;

/// A view: west, south, east, north in degrees (`bbox=w,s,e,n`, Leaflet's `toBBoxString`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bbox {
    pub west: f64,
    pub south: f64,
    pub east: f64,
    pub north: f64,
}

/// Metres per degree of latitude (and of longitude at the equator).
const M_PER_DEG: f64 = 111_320.0;

impl Bbox {
    /// Parses `w,s,e,n`. Latitudes are clamped to the Web-Mercator range (what the map can
    /// show); a view across the antimeridian (west > east) is refused rather than half-served.
    pub fn parse(text: &str) -> Result<Bbox, &'static str> {
        let v: Vec<f64> = text
            .split(',')
            .map(|p| p.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| "bbox must be four numbers: west,south,east,north")?;
        let [w, s, e, n] = v[..] else {
            return Err("bbox must be four numbers: west,south,east,north");
        };
        if !(w.is_finite() && s.is_finite() && e.is_finite() && n.is_finite()) {
            return Err("bbox must be finite numbers");
        }
        let (w, e) = (w.max(-180.0), e.min(180.0));
        let (s, n) = (s.max(-85.05), n.min(85.05));
        if w >= e || s >= n {
            return Err("bbox must have west < east and south < north (within -180..180, -85..85)");
        }
        Ok(Bbox {
            west: w,
            south: s,
            east: e,
            north: n,
        })
    }

    /// The `GEOSEARCH FROMLONLAT lon lat BYBOX width height m` that covers the view: centred
    /// on it, as tall as it and as wide as its widest parallel (the one nearest the equator).
    /// Redis measures a member's east-west distance along the member's own parallel, so the
    /// box reaches the view's corners on every parallel and can hold a little more:
    /// [`Bbox::contains`] trims that.
    pub fn search_box(&self) -> (f64, f64, f64, f64) {
        let lon = (self.west + self.east) / 2.0;
        let lat = (self.south + self.north) / 2.0;
        let widest = if self.south <= 0.0 && self.north >= 0.0 {
            0.0
        } else {
            self.south.abs().min(self.north.abs())
        };
        let width = (self.east - self.west) * M_PER_DEG * widest.to_radians().cos();
        let height = (self.north - self.south) * M_PER_DEG;
        // A little slack for Redis's geohash rounding; the trim is exact.
        (lon, lat, (width * 1.02).max(1.0), (height * 1.02).max(1.0))
    }

    pub(crate) fn contains(&self, lat: f64, lon: f64) -> bool {
        lat >= self.south && lat <= self.north && lon >= self.west && lon <= self.east
    }
}

/// The (lat, lon) of a Redis GEO score (`WITHHASH`: the 52-bit interleaved geohash Redis keeps
/// as the member's score), decoded as Redis decodes it for `WITHCOORD`: the middle of its cell,
/// about 0.6 m across. Reading the integer and decoding here costs Redis far less than
/// formatting two coordinates as text per member (docs/maps.md, figures).
pub(crate) fn decode_geohash(hash: u64) -> (f64, f64) {
    const LAT: f64 = 85.05112878;
    const STEP: u32 = 26;
    // Latitude bits are the even ones, longitude the odd ones.
    let even = |mut x: u64| {
        let mut out = 0u64;
        for i in 0..STEP {
            out |= (x & 1) << i;
            x >>= 2;
        }
        out as f64
    };
    let (ilat, ilon) = (even(hash), even(hash >> 1));
    let cells = (1u64 << STEP) as f64;
    let lat = -LAT + (ilat + 0.5) / cells * (2.0 * LAT);
    let lon = -180.0 + (ilon + 0.5) / cells * 360.0;
    (lat.clamp(-LAT, LAT), lon.clamp(-180.0, 180.0))
}

/// How a courier is drawn, by the age of his last accepted point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Freshness {
    Fresh,
    Late,
    /// Within `evict_warning` of leaving the live index.
    Evicting,
}

/// The thresholds of [`Freshness`], seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ages {
    pub late_after: f64,
    pub evict_after: f64,
    pub evict_warning: f64,
}

impl Ages {
    pub(crate) fn classify(&self, age: f64) -> Freshness {
        if age >= self.evict_after - self.evict_warning {
            Freshness::Evicting
        } else if age >= self.late_after {
            Freshness::Late
        } else {
            Freshness::Fresh
        }
    }
}

/// One courier in the view: `[id, lat, lon, age seconds, freshness, order or null]` on the wire
/// (arrays: a 2,000-marker refresh is a third smaller than with field names).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Marker(
    pub String,
    pub f64,
    pub f64,
    pub f64,
    pub Freshness,
    pub Option<String>,
);

/// A grid cell's couriers: `[lat, lon, count]`, at the mean position of its members.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Cluster(pub f64, pub f64, pub u64);

/// What one refresh answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct View {
    /// Server time of the read, unix seconds.
    pub now: f64,
    /// Couriers found in the view (all of them, even when clustered).
    pub in_view: usize,
    /// True when the read stopped at `web.max_scan`: there are more than `in_view`.
    pub truncated: bool,
    pub markers: Vec<Marker>,
    pub clusters: Vec<Cluster>,
}

/// Grid clusters of `points` (lat, lon) over `bbox`: `columns` across, rows by the view's
/// aspect ratio in metres, so cells are about square on the screen.
pub(crate) fn cluster(points: &[(f64, f64)], bbox: &Bbox, columns: usize) -> Vec<Cluster> {
    let mid = ((bbox.south + bbox.north) / 2.0).to_radians().cos();
    let w = (bbox.east - bbox.west) * mid;
    let h = bbox.north - bbox.south;
    let cols = columns.max(1);
    let rows = ((cols as f64 * h / w.max(1e-9)).ceil() as usize).clamp(1, 4 * cols);
    // Sums per cell in a flat vector: at most 4 x 256 x 256 cells, no hashing per point.
    let mut cells = vec![(0.0f64, 0.0f64, 0u64); cols * rows];
    for &(lat, lon) in points {
        let x = (((lon - bbox.west) / (bbox.east - bbox.west)) * cols as f64) as usize;
        let y = (((bbox.north - lat) / h) * rows as f64) as usize;
        let c = &mut cells[y.min(rows - 1) * cols + x.min(cols - 1)];
        c.0 += lat;
        c.1 += lon;
        c.2 += 1;
    }
    cells
        .into_iter()
        .filter(|c| c.2 > 0)
        .map(|(lat, lon, n)| Cluster(lat / n as f64, lon / n as f64, n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bbox_parses_and_refuses_nonsense() {
        let b = Bbox::parse("46.6,24.6,46.8,24.8").unwrap();
        assert_eq!((b.west, b.south, b.east, b.north), (46.6, 24.6, 46.8, 24.8));
        for bad in [
            "",
            "1,2,3",
            "1,2,3,4,5",
            "a,b,c,d",
            "NaN,1,2,3",
            "10,0,5,1",
            "0,10,1,5",
        ] {
            assert!(Bbox::parse(bad).is_err(), "{bad:?} accepted");
        }
        // Clamped to what a Web-Mercator map shows.
        let world = Bbox::parse("-200,-90,200,90").unwrap();
        assert_eq!((world.west, world.east), (-180.0, 180.0));
        assert!(world.north < 85.1 && world.south > -85.1);
    }

    #[test]
    fn the_search_box_covers_every_corner_of_the_view() {
        // Redis checks a member by its east-west distance along the centre's parallel and its
        // north-south distance: emulate that for the corners of views at several latitudes.
        for b in [
            Bbox::parse("46.0,24.0,47.0,25.0").unwrap(),
            Bbox::parse("-10,40,30,70").unwrap(),
            Bbox::parse("-60,-10,-30,20").unwrap(),
            Bbox::parse("100,-60,140,-20").unwrap(),
        ] {
            let (lon, lat, w, h) = b.search_box();
            for (clat, clon) in [
                (b.south, b.west),
                (b.south, b.east),
                (b.north, b.west),
                (b.north, b.east),
            ] {
                let dx = (clon - lon).abs() * M_PER_DEG * clat.to_radians().cos();
                let dy = (clat - lat).abs() * M_PER_DEG;
                assert!(
                    dx <= w / 2.0 && dy <= h / 2.0,
                    "{b:?}: corner {clat},{clon} outside"
                );
            }
            assert!(b.contains(lat, lon));
        }
    }

    #[test]
    fn geohashes_decode_as_redis_decodes_them() {
        // GEOADD then GEOSEARCH ... WITHHASH WITHCOORD on Redis 7.0: (hash, lon, lat).
        for (hash, lon, lat) in [
            (
                3590115651659981u64,
                46.675_299_704_074_86,
                24.713_601_008_386_654,
            ),
            (
                1367859919124626,
                -122.419_401_705_265_05,
                37.774_900_010_565_78,
            ),
        ] {
            let (la, lo) = decode_geohash(hash);
            assert!(
                (la - lat).abs() < 1e-9 && (lo - lon).abs() < 1e-9,
                "{hash}: {la},{lo}"
            );
        }
    }

    #[test]
    fn freshness_follows_the_age_thresholds() {
        let a = Ages {
            late_after: 10.0,
            evict_after: 60.0,
            evict_warning: 15.0,
        };
        assert_eq!(a.classify(0.0), Freshness::Fresh);
        assert_eq!(a.classify(9.9), Freshness::Fresh);
        assert_eq!(a.classify(10.0), Freshness::Late);
        assert_eq!(a.classify(44.9), Freshness::Late);
        assert_eq!(a.classify(45.0), Freshness::Evicting);
        assert_eq!(a.classify(1e9), Freshness::Evicting);
    }

    #[test]
    fn clusters_count_every_point_once_at_their_mean() {
        let b = Bbox::parse("0,0,10,10").unwrap();
        let mut pts = vec![(1.0, 1.0), (1.2, 1.4), (9.0, 9.0)];
        // Points on the edges fall in the edge cells, not outside the grid.
        pts.push((10.0, 10.0));
        pts.push((0.0, 0.0));
        let c = cluster(&pts, &b, 4);
        assert_eq!(c.iter().map(|c| c.2).sum::<u64>(), pts.len() as u64);
        let first = c
            .iter()
            .find(|c| c.2 == 3)
            .expect("the three near (1,1) share a cell");
        assert!((first.0 - 2.2 / 3.0).abs() < 1e-9 && (first.1 - 2.4 / 3.0).abs() < 1e-9);
        // 60,000 points over a 48-column grid: at most a few thousand cells, all counted.
        let many: Vec<(f64, f64)> = (0..60_000)
            .map(|i| ((i % 997) as f64 / 99.7, (i % 991) as f64 / 99.1))
            .collect();
        let c = cluster(&many, &b, 48);
        assert!(c.len() <= 48 * 48);
        assert_eq!(c.iter().map(|c| c.2).sum::<u64>(), 60_000);
    }
}
