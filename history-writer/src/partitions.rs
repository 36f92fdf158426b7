//! Day partitions of `courier_points`: the pure plan (names, bounds, what to create and what
//! is past retention, for a given clock) and the I/O that carries it out.
//!
//! One partition per UTC day, named `courier_points_pYYYYMMDD`, holding
//! `[day 00:00Z, next day 00:00Z)` of `received_at`. A partition is dropped once its WHOLE day
//! is older than `retention_days`, so a row is kept at least `retention_days` and less than
//! `retention_days + 1` days. Rows are never DELETEd: the partition goes at once. Several
//! writers may run the upkeep at the same moment: it runs under a transaction-scoped advisory
//! lock and uses `IF [NOT] EXISTS`.

use crate::error::HistoryError;
use tokio_postgres::Client;

const SECS_PER_DAY: i64 = 86_400;
/// Name prefix of every partition this module manages; other tables attached to the parent by
/// hand are left alone.
pub(crate) const PREFIX: &str = "courier_points_p";

/// UTC day number (days since 1970-01-01) of a unix time.
pub fn day_of(unix: f64) -> i64 {
    (unix / SECS_PER_DAY as f64).floor() as i64
}

/// (year, month, day) of a day number (proleptic Gregorian; H. Hinnant's civil_from_days).
pub(crate) fn civil(day: i64) -> (i64, u32, u32) {
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Day number of a date (the inverse of [`civil`]).
pub(crate) fn day_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `courier_points_pYYYYMMDD`
pub fn name(day: i64) -> String {
    let (y, m, d) = civil(day);
    format!("{PREFIX}{y:04}{m:02}{d:02}")
}

/// The day of a partition name this module made; `None` for any other name.
pub(crate) fn parse_name(name: &str) -> Option<i64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (y, m, d) = (
        digits[..4].parse().ok()?,
        digits[4..6].parse().ok()?,
        digits[6..].parse().ok()?,
    );
    let day = day_from_civil(y, m, d);
    // Refuses 20261131 and the like: it must round-trip.
    (civil(day) == (y, m, d)).then_some(day)
}

/// `YYYY-MM-DD 00:00:00+00`, the lower bound of a day's partition.
pub(crate) fn bound(day: i64) -> String {
    let (y, m, d) = civil(day);
    format!("{y:04}-{m:02}-{d:02} 00:00:00+00")
}

/// `CREATE TABLE IF NOT EXISTS` of one day's partition.
pub(crate) fn create_sql(day: i64) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{}\" PARTITION OF courier_points FOR VALUES FROM ('{}') TO ('{}')",
        name(day),
        bound(day),
        bound(day + 1)
    )
}

/// What upkeep must do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Days without a partition among today and the `days_ahead` days after it.
    pub create: Vec<i64>,
    /// Partitions whose whole day is older than the retention.
    pub drop: Vec<String>,
    /// Partitions past retention kept because their day is not yet aggregated ([`hold`]).
    pub held: Vec<String>,
}

/// Plans upkeep at `now` (unix seconds) given the partitions that exist.
pub(crate) fn plan(now: f64, existing: &[String], days_ahead: u32, retention_days: u32) -> Plan {
    let today = day_of(now);
    let have: Vec<i64> = existing.iter().filter_map(|n| parse_name(n)).collect();
    let create = (today..=today + i64::from(days_ahead))
        .filter(|d| !have.contains(d))
        .collect();
    let mut drop: Vec<(i64, String)> = existing
        .iter()
        .filter_map(|n| parse_name(n).map(|d| (d, n.clone())))
        // The day ends at (d + 1) * 86400; past retention once that end is retention_days old.
        .filter(|(d, _)| ((d + 1 + i64::from(retention_days)) * SECS_PER_DAY) as f64 <= now)
        .collect();
    drop.sort();
    Plan {
        create,
        drop: drop.into_iter().map(|(_, n)| n).collect(),
        held: Vec::new(),
    }
}

/// Moves out of `plan.drop` every partition whose day does not end by `aggregated_until` (the
/// aggregates' watermark, unix seconds; `None`: nothing aggregated yet): its points would be
/// lost to the aggregates, which are computed from the partitions and never after the drop.
pub(crate) fn hold(mut plan: Plan, aggregated_until: Option<i64>) -> Plan {
    let (drop, held) = std::mem::take(&mut plan.drop).into_iter().partition(|n| {
        match (parse_name(n), aggregated_until) {
            (Some(d), Some(mark)) => (d + 1) * SECS_PER_DAY <= mark,
            _ => false,
        }
    });
    plan.drop = drop;
    plan.held = held;
    plan
}

/// What one upkeep run changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub created: Vec<String>,
    pub dropped: Vec<String>,
    /// Past retention but kept: not yet aggregated.
    pub held: Vec<String>,
}

/// Serialises partition DDL of every writer on this database schema.
const LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtext('courier_points:partitions'), hashtext(current_schema()))";

/// The partitions attached to `courier_points` (in the schema the search path finds).
pub async fn existing(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Vec<String>, HistoryError> {
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'courier_points'::regclass ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Creates the partitions ahead and drops those past retention, at `now`. With
/// `hold_unaggregated` (aggregates on), a day the aggregates have not passed is kept.
pub async fn upkeep(
    client: &mut Client,
    now: f64,
    days_ahead: u32,
    retention_days: u32,
    hold_unaggregated: bool,
) -> Result<Outcome, HistoryError> {
    let tx = client.transaction().await?;
    // Never queue for long behind a long trail read (and block every writer behind us).
    tx.batch_execute("SET LOCAL lock_timeout = '10s'").await?;
    tx.execute(LOCK_SQL, &[]).await?;
    let have = existing(&tx).await?;
    let mut p = plan(now, &have, days_ahead, retention_days);
    if hold_unaggregated {
        p = hold(p, crate::aggregates::watermark(&tx).await?);
    }
    let mut out = Outcome::default();
    for day in &p.create {
        tx.batch_execute(&create_sql(*day)).await?;
        out.created.push(name(*day));
    }
    for n in &p.drop {
        tx.batch_execute(&format!("DROP TABLE IF EXISTS \"{n}\""))
            .await?;
        out.dropped.push(n.clone());
    }
    out.held = p.held;
    tx.commit().await?;
    Ok(out)
}

/// Creates the partitions of `days` that are missing (a batch held rows for a day without
/// one); returns the names it created.
pub async fn ensure_days(client: &mut Client, days: &[i64]) -> Result<Vec<String>, HistoryError> {
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = '10s'").await?;
    tx.execute(LOCK_SQL, &[]).await?;
    let have = existing(&tx).await?;
    let mut created = Vec::new();
    for &day in days {
        let n = name(day);
        if !have.contains(&n) {
            tx.batch_execute(&create_sql(day)).await?;
            created.push(n);
        }
    }
    tx.commit().await?;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // 2026-11-30 00:00:00Z
    const NOV30: f64 = 1_795_996_800.0;

    #[test]
    fn names_and_bounds_follow_the_utc_day() {
        assert_eq!(name(day_of(NOV30)), "courier_points_p20261130");
        assert_eq!(name(day_of(NOV30 - 0.000_001)), "courier_points_p20261129");
        assert_eq!(name(day_of(NOV30 + 86_399.999)), "courier_points_p20261130");
        assert_eq!(bound(day_of(NOV30)), "2026-11-30 00:00:00+00");
        assert_eq!(bound(day_of(NOV30) + 1), "2026-12-01 00:00:00+00");
        assert_eq!(
            name(day_from_civil(2028, 2, 29)),
            "courier_points_p20280229"
        );
        assert_eq!(day_of(0.0), 0);
        assert_eq!(civil(0), (1970, 1, 1));
    }

    #[test]
    fn parse_refuses_foreign_and_impossible_names() {
        assert_eq!(parse_name("courier_points_p20261130"), Some(day_of(NOV30)));
        for bad in [
            "courier_points_p2026113",
            "courier_points_p20261131",
            "courier_points_default",
            "x_p20261130",
            "courier_points_p2026113a",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn plan_creates_ahead_and_drops_whole_days_past_retention() {
        let today = day_of(NOV30);
        let existing: Vec<String> = [
            today - 31,
            today - 30,
            today - 29,
            today,
            today + 1,
            foreign(),
        ]
        .iter()
        .map(|d| name(*d))
        .chain(["courier_points_manual".to_string()])
        .collect();
        fn foreign() -> i64 {
            day_of(NOV30) - 100
        }
        // At 00:00:00 of Nov 30 with 30 days: Oct 30 (today-31) ended exactly 30 days ago and
        // goes; Oct 31 (today-30) still holds rows younger than 30 days.
        let p = plan(NOV30, &existing, 3, 30);
        assert_eq!(p.create, vec![today + 2, today + 3]);
        assert_eq!(p.drop, vec![name(foreign()), name(today - 31)]);
        // A second earlier, Oct 30's last row is not yet 30 days old, and today is Nov 29.
        let p = plan(NOV30 - 1.0, &existing, 3, 30);
        assert_eq!(p.drop, vec![name(foreign())]);
        assert_eq!(p.create, vec![today - 1, today + 2]);
    }

    #[test]
    fn a_day_not_yet_aggregated_is_held() {
        let today = day_of(NOV30);
        let existing: Vec<String> = [today - 33, today - 32, today - 31, today]
            .iter()
            .map(|d| name(*d))
            .collect();
        let p = plan(NOV30, &existing, 0, 30);
        assert_eq!(p.drop.len(), 3);
        // Nothing aggregated: every drop held.
        let h = hold(p.clone(), None);
        assert!(h.drop.is_empty());
        assert_eq!(h.held, p.drop);
        // Aggregated up to the end of today-32 (exactly): today-33 and today-32 go.
        let h = hold(p.clone(), Some((today - 31) * 86_400));
        assert_eq!(h.drop, vec![name(today - 33), name(today - 32)]);
        assert_eq!(h.held, vec![name(today - 31)]);
        // One second short of today-32's end: it stays.
        let h = hold(p, Some((today - 31) * 86_400 - 1));
        assert_eq!(h.drop, vec![name(today - 33)]);
    }

    proptest! {
        #[test]
        fn days_round_trip(day in -100_000i64..200_000) {
            let (y, m, d) = civil(day);
            prop_assert_eq!(day_from_civil(y, m, d), day);
            if (1000..=9999).contains(&y) {
                prop_assert_eq!(parse_name(&name(day)), Some(day));
            }
        }

        #[test]
        fn after_upkeep_the_window_is_exactly_right(now in 1.0e9f64..3.0e9, ahead in 0u32..10, ret in 1u32..60, have in proptest::collection::vec(-80i64..20, 0..40)) {
            let today = day_of(now);
            let existing: Vec<String> = have.iter().map(|o| name(today + o)).collect();
            let p = plan(now, &existing, ahead, ret);
            let mut after: Vec<i64> = existing.iter().filter(|n| !p.drop.contains(n)).filter_map(|n| parse_name(n)).collect();
            after.extend(&p.create);
            for d in today..=today + i64::from(ahead) {
                prop_assert!(after.contains(&d));
            }
            for d in after {
                // Kept partitions still hold rows younger than the retention.
                prop_assert!((((d + 1 + i64::from(ret)) * 86_400) as f64) > now);
            }
        }
    }
}
