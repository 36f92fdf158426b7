//! What to simulate: typed settings with defaults, validated once before anything connects.

use crate::motion::BBox;
use std::time::Duration;

/// How often couriers send.
#[derive(Debug, Clone, PartialEq)]
pub enum Profile {
    /// Every courier sends one point per interval (the reference article's lab).
    Fixed { interval: Duration },
    /// A day in the city: couriers on the way to a restaurant or a customer, available ones,
    /// and off-shift ones, each sending on distance moved with a heartbeat when standing.
    Mix(Mix),
}

/// The realistic mix. Fractions are of all couriers and are normalised to sum to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub to_restaurant: f64,
    pub to_customer: f64,
    pub available: f64,
    pub off_shift: f64,
    /// Seconds between two position checks of a courier on a delivery (uniform in the range).
    pub delivering_every: (f64, f64),
    /// Seconds between two position checks of an available courier.
    pub available_every: (f64, f64),
    /// A check sends a point only when the courier moved at least this far since his last one...
    pub min_move_m: f64,
    /// ...or when his last one is this old (the heartbeat of a standing courier). Keep it under
    /// the pipeline's `ingest.evict_after` (60 s), or standing couriers leave the live index.
    pub heartbeat: f64,
    /// Share of time a courier on a delivery stands (waiting at the restaurant or the door).
    pub delivering_still: f64,
    /// Share of time an available courier stands (parked, waiting for an order).
    pub available_still: f64,
    /// Mean length of a moving or standing spell, seconds.
    pub spell: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            to_restaurant: 0.25,
            to_customer: 0.25,
            available: 0.35,
            off_shift: 0.15,
            delivering_every: (3.0, 5.0),
            available_every: (15.0, 30.0),
            min_move_m: 25.0,
            heartbeat: 30.0,
            delivering_still: 0.2,
            available_still: 0.5,
            spell: 60.0,
        }
    }
}

impl Mix {
    /// Parses `to_restaurant=0.3,available=0.5,...`; names not given keep their defaults.
    pub fn parse_fractions(mut self, text: &str) -> Result<Self, String> {
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("--mix: expected name=fraction, got {part:?}"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("--mix: {k}: not a number: {v:?}"))?;
            match k.trim() {
                "to_restaurant" => self.to_restaurant = v,
                "to_customer" => self.to_customer = v,
                "available" => self.available = v,
                "off_shift" => self.off_shift = v,
                other => {
                    return Err(format!(
                        "--mix: unknown name {other:?} (to_restaurant, to_customer, available, off_shift)"
                    ))
                }
            }
        }
        Ok(self)
    }

    /// The four fractions, normalised: to_restaurant, to_customer, available, off_shift.
    pub(crate) fn fractions(&self) -> [f64; 4] {
        let f = [
            self.to_restaurant,
            self.to_customer,
            self.available,
            self.off_shift,
        ];
        let sum: f64 = f.iter().sum();
        f.map(|x| x / sum)
    }

    fn validate(&self) -> Result<(), String> {
        let f = [
            self.to_restaurant,
            self.to_customer,
            self.available,
            self.off_shift,
        ];
        if f.iter().any(|x| !x.is_finite() || *x < 0.0) || f.iter().sum::<f64>() <= 0.0 {
            return Err("mix fractions must be >= 0 with a positive sum".into());
        }
        for (name, (a, b)) in [
            ("delivering_every", self.delivering_every),
            ("available_every", self.available_every),
        ] {
            if !(a > 0.0 && b >= a && b.is_finite()) {
                return Err(format!("mix {name}: need 0 < min <= max"));
            }
        }
        if !(self.heartbeat > 0.0 && self.spell > 0.0 && self.min_move_m >= 0.0) {
            return Err("mix heartbeat and spell must be > 0, min_move_m >= 0".into());
        }
        for s in [self.delivering_still, self.available_still] {
            if !(0.0..=1.0).contains(&s) {
                return Err("mix still shares must be within 0..1".into());
            }
        }
        Ok(())
    }
}

/// Faults on demand. Fractions are of the couriers that send (not off shift).
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Couriers that lose the network once, for `outage_for`, buffering their points, then
    /// flush the buffer (original ts and seq) after the first live point.
    pub outage: f64,
    pub outage_for: Duration,
    /// Points a phone buffers while offline; beyond it the oldest are dropped (and counted).
    pub buffer_max: usize,
    /// Share of points sent as exactly (0, 0): a GPS with no fix.
    pub null_island: f64,
    /// Couriers whose GPS reports the same fixed default location for the whole run.
    pub default_location: f64,
    /// That location (lat, lon): many phones sharing it make a hot spot for dispatch.
    pub default_at: (f64, f64),
    /// Couriers whose app restarts once: the connection drops and seq starts again at 1.
    pub restart: f64,
    /// Faults happen at random times within this window from the start (default: the run's
    /// length, else 60 s).
    pub window: Option<Duration>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            outage: 0.0,
            outage_for: Duration::from_secs(20),
            buffer_max: 10_000,
            null_island: 0.0,
            default_location: 0.0,
            // Kingdom Centre, Riyadh: the article's restaurant.
            default_at: (24.7114, 46.6744),
            restart: 0.0,
            window: None,
        }
    }
}

impl Faults {
    fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("--outage", self.outage),
            ("--null-island", self.null_island),
            ("--default-location", self.default_location),
            ("--restart", self.restart),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name}: a fraction within 0..1, got {v}"));
            }
        }
        if self.buffer_max == 0 {
            return Err("faults buffer_max must be above 0".into());
        }
        let (lat, lon) = self.default_at;
        if !(lat.abs() <= 85.0 && lon.abs() <= 180.0) {
            return Err("--default-at: lat within +-85, lon within +-180".into());
        }
        Ok(())
    }
}

/// Customers watching orders: `orders` couriers get an order, and one watcher per order
/// measures the phone-to-viewer delay.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Watchers {
    pub orders: usize,
}

/// Everything the simulator needs besides the broker address.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub couriers: usize,
    pub profile: Profile,
    /// `None`: one MQTT connection per courier, as phones do (with a Last Will each).
    /// `Some(k)`: the couriers share k connections (load generation with few sockets).
    pub connections: Option<usize>,
    /// Connection attempts in progress at once (a ramp, so the broker's accept queue keeps up).
    pub connect_concurrency: usize,
    /// Stop after this long (`None`: until shutdown).
    pub duration: Option<Duration>,
    pub bbox: BBox,
    /// Courier ids are `<prefix><5-digit number>`.
    pub id_prefix: String,
    pub seed: u64,
    pub faults: Faults,
    pub watchers: Watchers,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            couriers: 1000,
            profile: Profile::Fixed {
                interval: Duration::from_secs(4),
            },
            connections: Some(8),
            connect_concurrency: 256,
            duration: None,
            bbox: BBox::RIYADH,
            id_prefix: "c".into(),
            seed: 42,
            faults: Faults::default(),
            watchers: Watchers::default(),
        }
    }
}

impl SimConfig {
    /// Checks every setting; the error names the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.couriers == 0 {
            return Err("--couriers must be above 0".into());
        }
        if self.connections == Some(0) {
            return Err("--connections must be above 0 (omit it for one per courier)".into());
        }
        if self.connect_concurrency == 0 {
            return Err("connect_concurrency must be above 0".into());
        }
        match &self.profile {
            Profile::Fixed { interval } if interval.is_zero() => {
                return Err("--interval must be above 0".into())
            }
            Profile::Fixed { .. } => {}
            Profile::Mix(m) => m.validate()?,
        }
        if !courier_wire::topic::valid_id(&format!("{}00000", self.id_prefix)) {
            return Err(format!(
                "--id-prefix {:?}: ids are 1-64 of [A-Za-z0-9._:-]",
                self.id_prefix
            ));
        }
        if self.watchers.orders > self.couriers {
            return Err("--orders cannot exceed --couriers".into());
        }
        let b = self.bbox;
        if !(b.lat_min < b.lat_max
            && b.lon_min < b.lon_max
            && b.lat_min.abs() <= 85.0
            && b.lat_max.abs() <= 85.0)
        {
            return Err(
                "bounding box: need lat_min < lat_max within +-85 and lon_min < lon_max".into(),
            );
        }
        self.faults.validate()
    }

    /// The window faults are drawn in, seconds.
    pub(crate) fn fault_window(&self) -> f64 {
        self.faults
            .window
            .or(self.duration)
            .unwrap_or(Duration::from_secs(60))
            .as_secs_f64()
    }

    /// How the interval reads in the summary line: `4s`, or `mix`.
    pub(crate) fn interval_label(&self) -> String {
        match &self.profile {
            Profile::Fixed { interval } => format!("{}s", interval.as_secs_f64()),
            Profile::Mix(_) => "3-5s/15-30s (mix)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        SimConfig::default().validate().unwrap();
        let c = SimConfig {
            profile: Profile::Mix(Mix::default()),
            connections: None,
            ..Default::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn bad_settings_name_themselves() {
        let bad = |c: SimConfig| c.validate().unwrap_err();
        assert!(bad(SimConfig {
            couriers: 0,
            ..Default::default()
        })
        .contains("--couriers"));
        assert!(bad(SimConfig {
            connections: Some(0),
            ..Default::default()
        })
        .contains("--connections"));
        assert!(bad(SimConfig {
            profile: Profile::Fixed {
                interval: Duration::ZERO
            },
            ..Default::default()
        })
        .contains("--interval"));
        assert!(bad(SimConfig {
            id_prefix: "a/b".into(),
            ..Default::default()
        })
        .contains("--id-prefix"));
        let f = Faults {
            outage: 1.5,
            ..Default::default()
        };
        assert!(bad(SimConfig {
            faults: f,
            ..Default::default()
        })
        .contains("--outage"));
        assert!(bad(SimConfig {
            couriers: 3,
            watchers: Watchers { orders: 4 },
            ..Default::default()
        })
        .contains("--orders"));
    }

    #[test]
    fn mix_fractions_parse_and_normalise() {
        let m = Mix::default()
            .parse_fractions("to_restaurant=1, to_customer=1,available=2,off_shift=0")
            .unwrap();
        assert_eq!(m.fractions(), [0.25, 0.25, 0.5, 0.0]);
        assert!(Mix::default()
            .parse_fractions("walking=1")
            .unwrap_err()
            .contains("unknown"));
        assert!(Mix::default()
            .parse_fractions("available")
            .unwrap_err()
            .contains("name=fraction"));
        let zero = Mix {
            to_restaurant: 0.0,
            to_customer: 0.0,
            available: 0.0,
            off_shift: 0.0,
            ..Default::default()
        };
        assert!(zero.validate().is_err());
    }
}
