//! The simulator's command-line arguments (`courier-pipeline simulate`) and the run they
//! describe: the binary parses them and wires the endpoints; what the flags mean, and which
//! combinations are refused, is decided here, next to the settings they set.

use crate::{SimConfig, SimError};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    #[arg(long, default_value_t = 1000)]
    pub couriers: usize,
    /// Fixed profile: seconds between two points of one courier (default 4 unless --mix).
    #[arg(long, conflicts_with = "mix")]
    pub interval: Option<f64>,
    /// Realistic mix instead of a fixed interval; fractions such as
    /// `to_restaurant=0.25,to_customer=0.25,available=0.35,off_shift=0.15` (`default` for these).
    #[arg(long)]
    pub mix: Option<String>,
    /// Mix: a check sends only after moving this many metres...
    #[arg(long, default_value_t = 20.0)]
    pub min_move: f64,
    /// ...or when the last point is this many seconds old (standing couriers).
    #[arg(long, default_value_t = 30.0)]
    pub heartbeat: f64,
    /// Share K MQTT connections among the couriers (default: one per courier, as phones do).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Connection attempts in flight at once while couriers come online.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Courier ids are <prefix><number>.
    #[arg(long, default_value = "c")]
    pub id_prefix: String,
    /// Assign K orders and watch each like a customer, measuring the phone-to-viewer delay:
    /// through the orders API and the viewer gateway with --orders-api, else straight in
    /// `courier:order` and `track/<order>` on the broker.
    #[arg(long, default_value_t = 0)]
    pub orders: usize,
    /// The orders API, e.g. http://127.0.0.1:8080 (needs SERVICE_KEY): orders are assigned
    /// and delivered there, and watched through the gateway URL of their tracking tokens.
    #[arg(long)]
    pub orders_api: Option<String>,
    /// More addresses of the same broker; courier connections are spread over MQTT_URL and
    /// these (one source address has about 28,000 ports per destination).
    #[arg(long = "also-mqtt-url")]
    pub also_mqtt_url: Vec<String>,
    /// Write every figure of the run to this file as JSON.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Fault: share of couriers that lose the network once, then flush their buffered points.
    #[arg(long, default_value_t = 0.0)]
    pub outage: f64,
    /// Seconds an outage lasts.
    #[arg(long, default_value_t = 20.0)]
    pub outage_for: f64,
    /// Fault: share of points sent as exactly (0, 0).
    #[arg(long, default_value_t = 0.0)]
    pub null_island: f64,
    /// Fault: share of couriers stuck at one shared default location (--default-at).
    #[arg(long, default_value_t = 0.0)]
    pub default_location: f64,
    /// The default location, `lat,lon`.
    #[arg(long, default_value = "24.7114,46.6744")]
    pub default_at: String,
    /// Fault: share of couriers whose app restarts once (seq starts again at 1).
    #[arg(long, default_value_t = 0.0)]
    pub restart: f64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

impl TryFrom<&SimArgs> for SimConfig {
    type Error = SimError;

    /// The run the flags describe, validated.
    fn try_from(a: &SimArgs) -> Result<SimConfig, SimError> {
        let profile = match (&a.mix, a.interval) {
            (Some(m), _) => {
                let base = crate::Mix {
                    min_move_m: a.min_move,
                    heartbeat: a.heartbeat,
                    ..Default::default()
                };
                let text = if m == "default" { "" } else { m.as_str() };
                crate::Profile::Mix(base.parse_fractions(text).map_err(SimError::Config)?)
            }
            (None, i) => {
                let i = i.unwrap_or(4.0);
                if !(i > 0.0 && i.is_finite()) {
                    return Err(SimError::Config("--interval must be above 0".into()));
                }
                crate::Profile::Fixed {
                    interval: Duration::from_secs_f64(i),
                }
            }
        };
        let default_at = a
            .default_at
            .split_once(',')
            .and_then(|(la, lo)| Some((la.trim().parse().ok()?, lo.trim().parse().ok()?)))
            .ok_or_else(|| SimError::Config("--default-at: expected lat,lon".into()))?;
        if !(a.outage_for >= 0.0 && a.outage_for.is_finite()) {
            return Err(SimError::Config("--outage-for must be >= 0".into()));
        }
        let cfg = crate::SimConfig {
            couriers: a.couriers,
            profile,
            connections: a.connections,
            connect_concurrency: a.connect_concurrency,
            duration: a.seconds.map(Duration::from_secs_f64),
            id_prefix: a.id_prefix.clone(),
            seed: a.seed,
            faults: crate::Faults {
                outage: a.outage,
                outage_for: Duration::from_secs_f64(a.outage_for),
                null_island: a.null_island,
                default_location: a.default_location,
                default_at,
                restart: a.restart,
                ..Default::default()
            },
            watchers: crate::Watchers { orders: a.orders },
            ..Default::default()
        };
        cfg.validate().map_err(SimError::Config)?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn config(args: &str) -> Result<SimConfig, SimError> {
        let c = Cmd::try_parse_from(std::iter::once("sim").chain(args.split_whitespace())).unwrap();
        SimConfig::try_from(&c.sim)
    }

    #[test]
    fn flags_become_the_run_they_describe() {
        let c =
            config("--couriers 7 --interval 0.5 --connections 2 --seconds 3 --outage 0.1").unwrap();
        assert_eq!(c.couriers, 7);
        assert_eq!(c.connections, Some(2));
        assert_eq!(c.duration, Some(Duration::from_secs(3)));
        assert!(
            matches!(c.profile, crate::Profile::Fixed { interval } if interval == Duration::from_millis(500))
        );
        assert_eq!(c.faults.outage, 0.1);
        assert!(matches!(
            config("--mix default").unwrap().profile,
            crate::Profile::Mix(_)
        ));
    }

    #[test]
    fn bad_flags_are_refused_with_the_flag_named() {
        for (args, flag) in [
            ("--interval 0", "--interval"),
            ("--default-at 24.7", "--default-at"),
            ("--outage-for=-1", "--outage-for"),
        ] {
            let e = config(args).unwrap_err().to_string();
            assert!(e.contains(flag), "{args}: {e}");
        }
    }
}
