//! `courier-pipeline nearest`: the dispatch query from the command line.

use clap::Args;
use std::time::Duration;

/// Where to search, how many, and how far.
#[derive(Args)]
pub(crate) struct NearestArgs {
    #[arg(long, allow_hyphen_values = true)]
    lat: f64,
    #[arg(long, allow_hyphen_values = true)]
    lon: f64,
    #[arg(long, default_value_t = 10)]
    count: usize,
    /// Ring radii in km, ascending.
    #[arg(long, default_value = "0.5,1,2,5")]
    radii: String,
    /// Skip couriers whose last point is older.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    max_age: Duration,
    /// Any `count` couriers of the first ring that holds enough, not the nearest (hot spots).
    #[arg(long)]
    any: bool,
    /// Run this many searches (32 in flight) and print searches/s and p99 instead.
    #[arg(long)]
    bench: Option<usize>,
}

/// Prints the nearest couriers, or searches/s with `--bench`.
pub(crate) async fn run(a: NearestArgs, config: courier_pipeline::Config) -> anyhow::Result<()> {
    let q = dispatch::Query {
        lat: a.lat,
        lon: a.lon,
        count: a.count,
        radii_km: dispatch::query::parse_radii(&a.radii).map_err(anyhow::Error::msg)?,
        max_age: a.max_age,
        any: a.any,
    };
    q.validate()?;
    let d = dispatch::Dispatch::connect(&config.redis, config.keys.clone()).await?;
    if let Some(n) = a.bench {
        let r = dispatch::bench::searches(&d, vec![q], n, 32).await?;
        println!("{}", r.line("nearest"));
        return Ok(());
    }
    let now = courier_wire::clock::unix_now();
    let found = d.nearest(&q, now).await?;
    match found.ring {
        Some(r) => println!(
            "{} nearest within {} km (ring {} of {}), seen in the last {}:",
            found.couriers.len(),
            q.radii_km[r],
            r + 1,
            q.radii_km.len(),
            humantime::format_duration(q.max_age)
        ),
        None => println!(
            "only {} within {} km (the widest ring), seen in the last {}:",
            found.couriers.len(),
            q.radii_km.last().copied().unwrap_or_default(),
            humantime::format_duration(q.max_age)
        ),
    }
    for c in &found.couriers {
        println!(
            "  {}  {:.3} km  last seen {:.1}s ago",
            c.id,
            c.dist_km,
            (now - c.seen).max(0.0)
        );
    }
    Ok(())
}
