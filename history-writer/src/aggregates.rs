//! Anonymous aggregates: per geohash-6 cell and UTC hour of `received_at`, the distinct
//! couriers, the points, and the median and 90th percentile of their speeds, written only
//! where at least k distinct couriers were present. They hold no courier or order id, so they
//! may outlive the raw trail (`aggregate_retention_days`, two years by default).
//!
//! ```text
//! [timer, every aggregate_every] --> one transaction per closed hour:
//!    aggregate_watermark FOR UPDATE --> the hour's points --GROUP BY cell, HAVING >= k-->
//!    DELETE + INSERT courier_aggregates of that hour --> watermark + 1 h --> COMMIT
//! ```
//!
//! Computed in PostgreSQL, one statement per hour: the points never leave the database (a
//! million rows over the wire and decoded would cost more than the whole aggregation), and
//! the k threshold is applied before anything is returned. A crash anywhere rolls the hour
//! back; the next run starts again from the watermark, so an hour is counted exactly once.
//! The partition drop keeps every day not yet past the watermark (`partitions::hold`).
//!
//! Speed: the haversine distance between consecutive points of one courier in the hour
//! (ordered by phone time, each delivered point once), over the phone-time interval,
//! attributed to the cell of the later point. Intervals above [`MAX_GAP_SECS`] are not a speed
//! (the courier stopped sending), nor are speeds above [`MAX_SPEED_MPS`] (a GPS jump).
//!
//! Rows that reach PostgreSQL after their hour was aggregated (a writer's buffer held them
//! past `aggregate_delay`) are in the trail but not in the aggregates.

use crate::error::HistoryError;
use crate::geohash;
use crate::partitions;
use crate::rows::system_time;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_postgres::{Client, GenericClient};

pub(crate) const HOUR: i64 = 3600;
/// Longest phone-time gap between two points that still makes a speed sample.
pub(crate) const MAX_GAP_SECS: f64 = 60.0;
/// Faster than this (252 km/h) is a GPS jump, not a courier.
pub(crate) const MAX_SPEED_MPS: f64 = 70.0;
/// Mean earth radius (IUGG), metres: the one the `geo` crate's haversine uses.
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// The cell-hours of one hour that have at least `$3` couriers. Parameters: hour start, hour
/// end, k, max gap, max speed, earth radius. The grid indices are those of [`geohash`].
const HOUR_SQL: &str = "WITH pts AS ( \
       SELECT DISTINCT ON (courier_id, seq, phone_ts) courier_id, seq, phone_ts, lat, lon \
       FROM courier_points WHERE received_at >= $1 AND received_at < $2 \
       ORDER BY courier_id, seq, phone_ts, received_at), \
     seg AS ( \
       SELECT courier_id, lat, lon, \
         extract(epoch FROM phone_ts - lag(phone_ts) OVER w)::float8 AS dt, \
         lag(lat) OVER w AS plat, lag(lon) OVER w AS plon \
       FROM pts WINDOW w AS (PARTITION BY courier_id ORDER BY phone_ts, seq)), \
     sp AS ( \
       SELECT courier_id, \
         least(greatest(floor((lon + 180.0) / 360.0 * 32768.0), 0), 32767)::int8 AS x, \
         least(greatest(floor((lat + 90.0) / 180.0 * 32768.0), 0), 32767)::int8 AS y, \
         CASE WHEN dt > 0 AND dt <= $4 THEN \
           2.0 * $6::float8 * asin(sqrt(power(sin(radians(lat - plat) / 2.0), 2) \
             + cos(radians(plat)) * cos(radians(lat)) * power(sin(radians(lon - plon) / 2.0), 2))) / dt \
         END AS v \
       FROM seg) \
     SELECT x, y, count(DISTINCT courier_id)::int4, count(*)::int4, \
       count(v) FILTER (WHERE v <= $5)::int4, \
       percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FILTER (WHERE v <= $5), \
       percentile_cont(0.9) WITHIN GROUP (ORDER BY v) FILTER (WHERE v <= $5) \
     FROM sp GROUP BY x, y HAVING count(DISTINCT courier_id) >= $3";

const INSERT_SQL: &str = "INSERT INTO courier_aggregates \
     (hour, cell, couriers, points, segments, median_speed_mps, p90_speed_mps) \
     SELECT $1, * FROM unnest($2::text[], $3::int4[], $4::int4[], $5::int4[], $6::float8[], $7::float8[])";

/// One written cell-hour.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CellHour {
    pub cell: String,
    pub couriers: i32,
    pub points: i32,
    pub segments: i32,
    pub median_speed_mps: Option<f64>,
    pub p90_speed_mps: Option<f64>,
}

/// Start of the hour holding `unix`.
pub(crate) fn hour_of(unix: f64) -> i64 {
    (unix / HOUR as f64).floor() as i64 * HOUR
}

/// The next hour to aggregate, if it has closed `delay` ago: rows of an hour keep arriving
/// for as long as a writer's buffer holds them.
pub(crate) fn next_hour(done_until: i64, now: f64, delay: Duration) -> Option<i64> {
    ((done_until + HOUR) as f64 + delay.as_secs_f64() <= now).then_some(done_until)
}

/// Where aggregation starts on a database that never ran it: the oldest day partition (the
/// whole history), else the current hour.
pub(crate) fn first_mark(partitions: &[String], now: f64) -> i64 {
    partitions
        .iter()
        .filter_map(|n| partitions::parse_name(n))
        .min()
        .map_or(hour_of(now), |d| d * 86_400)
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// Every hour before this is aggregated; `None` before the first run.
pub(crate) async fn watermark(client: &impl GenericClient) -> Result<Option<i64>, HistoryError> {
    let row = client
        .query_opt("SELECT done_until FROM aggregate_watermark", &[])
        .await?;
    Ok(row.map(|r| unix(r.get(0))))
}

/// The cell-hours of `[hour, hour + 1 h)` with at least `k` couriers.
pub(crate) async fn compute_hour(
    client: &impl GenericClient,
    hour: i64,
    k: u32,
) -> Result<Vec<CellHour>, HistoryError> {
    let (from, to) = (system_time(hour as f64), system_time((hour + HOUR) as f64));
    let k = i64::from(k);
    let rows = client
        .query(
            HOUR_SQL,
            &[
                &from,
                &to,
                &k,
                &MAX_GAP_SECS,
                &MAX_SPEED_MPS,
                &EARTH_RADIUS_M,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            Some(CellHour {
                cell: geohash::cell(r.get(0), r.get(1))?,
                couriers: r.get(2),
                points: r.get(3),
                segments: r.get(4),
                median_speed_mps: r.get(5),
                p90_speed_mps: r.get(6),
            })
        })
        .collect())
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOutcome {
    /// Hours aggregated (each committed with its watermark).
    pub hours: u32,
    /// Cell-hours written.
    pub cells: u64,
    /// The watermark after the run.
    pub done_until: i64,
    /// Aggregate rows deleted past their retention.
    pub expired: u64,
}

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub min_couriers: u32,
    pub delay: Duration,
    pub retention_days: u32,
    /// At most this many hours per run, so that a long catch-up still lets shutdown in.
    pub max_hours: u32,
}

/// Aggregates every closed hour after the watermark (at most `max_hours`), one transaction
/// each, then deletes aggregates past their retention. Safe beside other writers doing the
/// same: the watermark row is locked for the hour's transaction.
pub async fn run_pending(
    client: &mut Client,
    now: f64,
    s: &RunSettings,
) -> Result<RunOutcome, HistoryError> {
    let mut out = RunOutcome::default();
    loop {
        let tx = client.transaction().await?;
        tx.batch_execute("SET LOCAL lock_timeout = '10s'; SET LOCAL statement_timeout = '10min'")
            .await?;
        let mark = match tx
            .query_opt("SELECT done_until FROM aggregate_watermark FOR UPDATE", &[])
            .await?
        {
            Some(r) => unix(r.get(0)),
            None => {
                let first = first_mark(&partitions::existing(&tx).await?, now);
                tx.execute(
                    "INSERT INTO aggregate_watermark (done_until) VALUES ($1) ON CONFLICT DO NOTHING",
                    &[&system_time(first as f64)],
                )
                .await?;
                tx.commit().await?;
                continue;
            }
        };
        out.done_until = mark;
        let Some(hour) = next_hour(mark, now, s.delay).filter(|_| out.hours < s.max_hours) else {
            tx.commit().await?;
            break;
        };
        let cells = compute_hour(&tx, hour, s.min_couriers).await?;
        let at = system_time(hour as f64);
        // An hour is only ever written whole, but an operator may have moved the watermark
        // back: replace, never add.
        tx.execute("DELETE FROM courier_aggregates WHERE hour = $1", &[&at])
            .await?;
        if !cells.is_empty() {
            let col = |f: fn(&CellHour) -> i32| cells.iter().map(f).collect::<Vec<i32>>();
            let names: Vec<&str> = cells.iter().map(|c| c.cell.as_str()).collect();
            let med: Vec<Option<f64>> = cells.iter().map(|c| c.median_speed_mps).collect();
            let p90: Vec<Option<f64>> = cells.iter().map(|c| c.p90_speed_mps).collect();
            tx.execute(
                INSERT_SQL,
                &[
                    &at,
                    &names,
                    &col(|c| c.couriers),
                    &col(|c| c.points),
                    &col(|c| c.segments),
                    &med,
                    &p90,
                ],
            )
            .await?;
        }
        tx.execute(
            "UPDATE aggregate_watermark SET done_until = $1, updated_at = now()",
            &[&system_time((hour + HOUR) as f64)],
        )
        .await?;
        tx.commit().await?;
        out.hours += 1;
        out.cells += cells.len() as u64;
        out.done_until = hour + HOUR;
    }
    let cutoff = system_time(now - f64::from(s.retention_days) * 86_400.0);
    out.expired = client
        .execute("DELETE FROM courier_aggregates WHERE hour < $1", &[&cutoff])
        .await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-11-30 00:00:00Z
    const NOV30: f64 = 1_795_996_800.0;

    #[test]
    fn an_hour_waits_for_its_delay() {
        let h = NOV30 as i64;
        let delay = Duration::from_secs(600);
        assert_eq!(next_hour(h, NOV30 + 3600.0 + 599.0, delay), None);
        assert_eq!(next_hour(h, NOV30 + 3600.0 + 600.0, delay), Some(h));
        assert_eq!(hour_of(NOV30 + 3599.9), h);
        assert_eq!(hour_of(NOV30 - 0.1), h - 3600);
    }

    #[test]
    fn the_first_run_starts_at_the_oldest_partition() {
        let day = partitions::day_of(NOV30);
        let names = vec![
            partitions::name(day),
            partitions::name(day - 3),
            "courier_points_manual".to_string(),
        ];
        assert_eq!(first_mark(&names, NOV30 + 7200.5), (day - 3) * 86_400);
        assert_eq!(first_mark(&[], NOV30 + 7200.5), NOV30 as i64 + 7200);
    }
}
