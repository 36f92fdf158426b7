//! The outbox in PostgreSQL (`sql/0003_order_events.sql`): every statement of the notify role,
//! in one place. Times cross the boundary as unix seconds (float8), so no date crate is needed.

use crate::breaker::Breaker;
use crate::sign::Event;
use crate::source::StreamEvent;
use std::time::Duration;
use tokio_postgres::{Client, GenericClient};

/// What one relay batch did to the outbox.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// New events (their keys were not in the outbox yet).
    pub events: u64,
    /// Deliveries created for them (one per subscribed endpoint).
    pub deliveries: u64,
    /// Push notices created for them (one per live device of the order, for `push_kinds`).
    pub notices: u64,
}

/// Records events (a relay batch), their deliveries and their push notices in one statement:
/// an event already recorded (same dedupe key: the relay handed it twice) is skipped with its
/// deliveries and notices. An endpoint (a device) gets the events recorded after its
/// registration; `push_kinds` empty: no notices. Returns the new keys too.
pub(crate) async fn record(
    db: &impl GenericClient,
    events: &[StreamEvent],
    push_kinds: &[String],
) -> Result<(Recorded, Vec<String>), tokio_postgres::Error> {
    if events.is_empty() {
        return Ok((Recorded::default(), Vec::new()));
    }
    let col = |f: fn(&StreamEvent) -> &str| events.iter().map(f).collect::<Vec<&str>>();
    let keys = col(|e| &e.key);
    let kinds = col(|e| &e.kind);
    let tenants = col(|e| &e.tenant);
    let orders = col(|e| &e.order);
    let couriers: Vec<Option<&str>> = events.iter().map(|e| e.courier.as_deref()).collect();
    let at: Vec<f64> = events.iter().map(|e| e.at).collect();
    let rows = db
        .query(
            "WITH ins AS (
                 INSERT INTO order_events (dedupe_key, kind, tenant, order_id, courier_id, occurred_at)
                 SELECT k, kd, t, o, c, to_timestamp(a)
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::float8[])
                      AS u(k, kd, t, o, c, a)
                 ON CONFLICT (dedupe_key) DO NOTHING
                 RETURNING id, kind, tenant, order_id, dedupe_key),
             d AS (
                 INSERT INTO webhook_deliveries (event_id, endpoint_id)
                 SELECT ins.id, e.id FROM ins JOIN webhook_endpoints e
                   ON e.tenant = ins.tenant AND ins.kind = ANY (e.kinds) AND e.disabled_at IS NULL
                 RETURNING 1),
             n AS (
                 INSERT INTO push_notices (event_id, device_id, kind)
                 SELECT ins.id, p.id, ins.kind FROM ins JOIN push_devices p
                   ON p.order_id = ins.order_id AND p.tenant = ins.tenant AND p.retired_at IS NULL
                 WHERE ins.kind = ANY ($7)
                 ON CONFLICT (device_id, kind) DO NOTHING
                 RETURNING 1)
             SELECT ins.dedupe_key, (SELECT count(*) FROM d), (SELECT count(*) FROM n) FROM ins",
            &[&keys, &kinds, &tenants, &orders, &couriers, &at, &push_kinds],
        )
        .await?;
    let count = |i| rows.first().map(|r| r.get::<_, i64>(i) as u64).unwrap_or(0);
    let new: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    Ok((
        Recorded {
            events: new.len() as u64,
            deliveries: count(1),
            notices: count(2),
        },
        new,
    ))
}

/// One delivery a dispatcher claimed.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub delivery_id: i64,
    /// Attempts made, this one included.
    pub attempts: u32,
    /// Unix seconds of the first attempt (this one if it is the first).
    pub first_attempt_at: f64,
    pub endpoint_id: i64,
    pub url: String,
    pub secret: String,
    /// The endpoint's consecutive failures before this attempt.
    pub failures: u32,
    pub event: Event,
}

/// Claims up to `limit` due deliveries for `lease` (another dispatcher takes them after it
/// runs out, if this one never reports). An endpoint with an open breaker gives none; a
/// half-open one gives one (the probe), and is held open for the lease meanwhile so that no
/// other process probes it too. `FOR UPDATE SKIP LOCKED`: processes claiming at once get
/// different rows. Both queries walk an index in due order and stop at `limit`: the cost of a
/// claim does not grow with the backlog.
pub(crate) async fn claim(
    db: &mut Client,
    limit: usize,
    lease: Duration,
    breaker: &Breaker,
) -> Result<Vec<Claimed>, tokio_postgres::Error> {
    let tx = db.transaction().await?;
    let threshold = breaker.open_after as i32;
    // Half-open endpoints first (few): one probe each.
    let probes: Vec<i64> = tx
        .query(
            "SELECT d.id FROM webhook_endpoints e CROSS JOIN LATERAL (
                 SELECT id FROM webhook_deliveries
                 WHERE endpoint_id = e.id AND state = 'pending' AND next_attempt_at <= now()
                 ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED) d
             WHERE e.failures >= $1 AND e.disabled_at IS NULL
               AND (e.open_until IS NULL OR e.open_until <= now())
             LIMIT $2",
            &[&threshold, &(limit as i64)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let rest = limit.saturating_sub(probes.len()) as i64;
    let mut ids: Vec<i64> = tx
        .query(
            "SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
             WHERE d.state = 'pending' AND d.next_attempt_at <= now() AND e.disabled_at IS NULL
               AND e.failures < $2 AND (e.open_until IS NULL OR e.open_until <= now())
             ORDER BY d.next_attempt_at LIMIT $1
             FOR UPDATE OF d SKIP LOCKED",
            &[&rest, &threshold],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.extend(probes);
    // Locked above: this transaction alone changes them.
    let rows = tx
        .query(
            "WITH upd AS (
                 UPDATE webhook_deliveries d
                 SET attempts = d.attempts + 1, last_attempt_at = now(),
                     first_attempt_at = coalesce(d.first_attempt_at, now()),
                     next_attempt_at = now() + make_interval(secs => $2)
                 WHERE d.id = ANY ($1)
                 RETURNING d.id, d.attempts, d.first_attempt_at, d.event_id, d.endpoint_id)
             SELECT upd.id, upd.attempts, extract(epoch FROM upd.first_attempt_at)::float8,
                    e.id, e.url, e.secret, e.failures,
                    ev.id, ev.kind, ev.tenant, ev.order_id, ev.courier_id,
                    extract(epoch FROM ev.occurred_at)::float8
             FROM upd JOIN webhook_endpoints e ON e.id = upd.endpoint_id
                      JOIN order_events ev ON ev.id = upd.event_id",
            &[&ids, &lease.as_secs_f64()],
        )
        .await?;
    let claimed: Vec<Claimed> = rows
        .iter()
        .map(|r| Claimed {
            delivery_id: r.get(0),
            attempts: r.get::<_, i32>(1) as u32,
            first_attempt_at: r.get(2),
            endpoint_id: r.get(3),
            url: r.get(4),
            secret: r.get(5),
            failures: r.get::<_, i32>(6) as u32,
            event: Event {
                id: r.get(7),
                kind: r.get(8),
                tenant: r.get(9),
                order_id: r.get(10),
                courier_id: r.get(11),
                occurred_at: r.get(12),
            },
        })
        .collect();
    let probing: Vec<i64> = claimed
        .iter()
        .filter(|c| breaker.probing(c.failures))
        .map(|c| c.endpoint_id)
        .collect();
    if !probing.is_empty() {
        tx.execute(
            "UPDATE webhook_endpoints SET open_until = now() + make_interval(secs => $2)
             WHERE id = ANY ($1)",
            &[&probing, &lease.as_secs_f64()],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(claimed)
}

/// Stores many delivered attempts at once (the common case: one statement for a round's
/// successes) and closes their endpoints' breakers.
pub(crate) async fn delivered(
    db: &Client,
    done: &[(i64, i64, u16)],
) -> Result<(), tokio_postgres::Error> {
    if done.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = done.iter().map(|d| d.0).collect();
    let statuses: Vec<i32> = done.iter().map(|d| i32::from(d.2)).collect();
    let mut endpoints: Vec<i64> = done.iter().map(|d| d.1).collect();
    endpoints.sort_unstable();
    endpoints.dedup();
    db.execute(
        "UPDATE webhook_deliveries d SET state = 'delivered', last_status = u.s, last_error = NULL,
             done_at = now()
         FROM unnest($1::bigint[], $2::int[]) AS u(id, s) WHERE d.id = u.id",
        &[&ids, &statuses],
    )
    .await?;
    db.execute(
        "UPDATE webhook_endpoints SET failures = 0, open_until = NULL
         WHERE id = ANY ($1) AND (failures <> 0 OR open_until IS NOT NULL)",
        &[&endpoints],
    )
    .await?;
    Ok(())
}

/// The end of one attempt, as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Delivered {
        status: u16,
    },
    Retry {
        after: Duration,
        status: Option<u16>,
        error: String,
    },
    Dead {
        status: Option<u16>,
        error: String,
    },
}

/// Stores an attempt's outcome and the endpoint's breaker in one transaction.
pub(crate) async fn complete(
    db: &mut Client,
    c: &Claimed,
    outcome: &Outcome,
    breaker: &Breaker,
) -> Result<(), tokio_postgres::Error> {
    let tx = db.transaction().await?;
    let (state, status, error, after) = match outcome {
        Outcome::Delivered { status } => ("delivered", Some(*status), None, 0.0),
        Outcome::Retry {
            after,
            status,
            error,
        } => (
            "pending",
            *status,
            Some(error.as_str()),
            after.as_secs_f64(),
        ),
        Outcome::Dead { status, error } => ("dead", *status, Some(error.as_str()), 0.0),
    };
    tx.execute(
        "UPDATE webhook_deliveries SET state = $2, last_status = $3, last_error = $4,
             next_attempt_at = now() + make_interval(secs => $5),
             done_at = CASE WHEN $2 = 'pending' THEN NULL ELSE now() END
         WHERE id = $1",
        &[
            &c.delivery_id,
            &state,
            &status.map(i32::from),
            &error,
            &after,
        ],
    )
    .await?;
    // The breaker counts from the row's current value: attempts of other processes count too.
    let succeeded = matches!(outcome, Outcome::Delivered { .. });
    let row = tx
        .query_one(
            "SELECT failures FROM webhook_endpoints WHERE id = $1 FOR UPDATE",
            &[&c.endpoint_id],
        )
        .await?;
    let next = breaker.after(row.get::<_, i32>(0) as u32, succeeded);
    tx.execute(
        "UPDATE webhook_endpoints SET failures = $2,
             open_until = CASE WHEN $3::float8 IS NULL THEN NULL
                               ELSE now() + make_interval(secs => $3) END
         WHERE id = $1",
        &[
            &c.endpoint_id,
            &(next.failures.min(i32::MAX as u32) as i32),
            &next.open_for.map(|d| d.as_secs_f64()),
        ],
    )
    .await?;
    tx.commit().await
}

/// A registered endpoint, as listed (never its secret).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Endpoint {
    pub id: i64,
    pub tenant: String,
    pub url: String,
    pub kinds: Vec<String>,
    pub created_at: f64,
    pub failures: i32,
    /// Unix seconds until which the breaker holds its deliveries.
    pub open_until: Option<f64>,
}

pub(crate) async fn create_endpoint(
    db: &Client,
    tenant: &str,
    url: &str,
    kinds: &[String],
    secret: &str,
) -> Result<i64, tokio_postgres::Error> {
    let r = db
        .query_one(
            "INSERT INTO webhook_endpoints (tenant, url, kinds, secret) VALUES ($1, $2, $3, $4)
             RETURNING id",
            &[&tenant, &url, &kinds, &secret],
        )
        .await?;
    Ok(r.get(0))
}

pub(crate) async fn endpoints(
    db: &Client,
    tenant: &str,
) -> Result<Vec<Endpoint>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT id, tenant, url, kinds, extract(epoch FROM created_at)::float8, failures,
                    extract(epoch FROM open_until)::float8
             FROM webhook_endpoints WHERE tenant = $1 AND disabled_at IS NULL ORDER BY id",
            &[&tenant],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Endpoint {
            id: r.get(0),
            tenant: r.get(1),
            url: r.get(2),
            kinds: r.get(3),
            created_at: r.get(4),
            failures: r.get(5),
            open_until: r.get(6),
        })
        .collect())
}

/// Disables an endpoint of `tenant`: no new deliveries, pending ones are not attempted.
pub(crate) async fn disable_endpoint(
    db: &Client,
    tenant: &str,
    id: i64,
) -> Result<bool, tokio_postgres::Error> {
    let n = db
        .execute(
            "UPDATE webhook_endpoints SET disabled_at = now()
             WHERE id = $1 AND tenant = $2 AND disabled_at IS NULL",
            &[&id, &tenant],
        )
        .await?;
    Ok(n == 1)
}

/// A delivery given up on.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct DeadLetter {
    pub delivery_id: i64,
    pub endpoint_id: i64,
    pub webhook_id: String,
    pub kind: String,
    pub order_id: String,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub first_attempt_at: Option<f64>,
    pub dead_at: Option<f64>,
}

pub(crate) async fn dead_letters(
    db: &Client,
    tenant: &str,
    limit: i64,
) -> Result<Vec<DeadLetter>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT d.id, d.endpoint_id, ev.id, ev.kind, ev.order_id, d.attempts, d.last_status,
                    d.last_error, extract(epoch FROM d.first_attempt_at)::float8,
                    extract(epoch FROM d.done_at)::float8
             FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
                  JOIN order_events ev ON ev.id = d.event_id
             WHERE d.state = 'dead' AND e.tenant = $1 ORDER BY d.done_at DESC LIMIT $2",
            &[&tenant, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadLetter {
            delivery_id: r.get(0),
            endpoint_id: r.get(1),
            webhook_id: crate::sign::message_id(r.get(2)),
            kind: r.get(3),
            order_id: r.get(4),
            attempts: r.get(5),
            last_status: r.get(6),
            last_error: r.get(7),
            first_attempt_at: r.get(8),
            dead_at: r.get(9),
        })
        .collect())
}

/// Puts a dead letter of `tenant` back in line, as new (attempts and age from zero); the
/// `webhook-id` stays, so a consumer that did get it dedupes.
pub(crate) async fn replay(
    db: &Client,
    tenant: &str,
    delivery: i64,
) -> Result<bool, tokio_postgres::Error> {
    let n = db
        .execute(
            "UPDATE webhook_deliveries d SET state = 'pending', attempts = 0, next_attempt_at = now(),
                 first_attempt_at = NULL, done_at = NULL
             FROM webhook_endpoints e
             WHERE d.id = $1 AND d.state = 'dead' AND e.id = d.endpoint_id AND e.tenant = $2",
            &[&delivery, &tenant],
        )
        .await?;
    Ok(n == 1)
}

/// Deletes what is past its keeping time (notices with deliveries); returns (deliveries and
/// notices, events) deleted.
pub(crate) async fn prune(
    db: &Client,
    keep_delivered: Duration,
    keep_dead: Duration,
) -> Result<(u64, u64), tokio_postgres::Error> {
    let d = db
        .execute(
            "DELETE FROM webhook_deliveries
             WHERE (state = 'delivered' AND done_at < now() - make_interval(secs => $1))
                OR (state = 'dead' AND done_at < now() - make_interval(secs => $2))",
            &[&keep_delivered.as_secs_f64(), &keep_dead.as_secs_f64()],
        )
        .await?
        + db.execute(
            "DELETE FROM push_notices WHERE state <> 'pending'
               AND done_at < now() - make_interval(secs => $1)",
            &[&keep_delivered.as_secs_f64()],
        )
        .await?;
    let e = db
        .execute(
            "DELETE FROM order_events ev
             WHERE recorded_at < now() - make_interval(secs => $1)
               AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = ev.id)
               AND NOT EXISTS (SELECT 1 FROM push_notices n WHERE n.event_id = ev.id)",
            &[&keep_delivered.as_secs_f64()],
        )
        .await?;
    Ok((d, e))
}

/// (pending deliveries, age in s of the oldest pending one's event, dead letters, open breakers)
pub(crate) async fn figures(db: &Client) -> Result<(i64, f64, i64, i64), tokio_postgres::Error> {
    let r = db
        .query_one(
            "SELECT
               (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
               coalesce((SELECT extract(epoch FROM now() - min(ev.recorded_at))::float8
                         FROM webhook_deliveries d JOIN order_events ev ON ev.id = d.event_id
                         WHERE d.state = 'pending'), 0),
               (SELECT count(*) FROM webhook_deliveries WHERE state = 'dead'),
               (SELECT count(*) FROM webhook_endpoints WHERE open_until > now() AND disabled_at IS NULL)",
            &[],
        )
        .await?;
    Ok((r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// A push notice a dispatcher claimed.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedNotice {
    pub notice_id: i64,
    pub attempts: u32,
    pub first_attempt_at: f64,
    pub device_id: i64,
    pub token: String,
    /// The device was retired after the notice was made: it is skipped, not sent.
    pub retired: bool,
    pub order_id: String,
    pub kind: String,
}

/// Claims up to `limit` due push notices for `lease`, as [`claim`] does deliveries.
pub(crate) async fn claim_notices(
    db: &Client,
    limit: usize,
    lease: Duration,
) -> Result<Vec<ClaimedNotice>, tokio_postgres::Error> {
    let rows = db
        .query(
            "WITH due AS (
                 SELECT id FROM push_notices WHERE state = 'pending' AND next_attempt_at <= now()
                 ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED),
             upd AS (
                 UPDATE push_notices n SET attempts = n.attempts + 1,
                     first_attempt_at = coalesce(n.first_attempt_at, now()),
                     next_attempt_at = now() + make_interval(secs => $2)
                 FROM due WHERE n.id = due.id
                 RETURNING n.id, n.attempts, n.first_attempt_at, n.device_id, n.event_id)
             SELECT upd.id, upd.attempts, extract(epoch FROM upd.first_attempt_at)::float8,
                    p.id, p.token, p.retired_at IS NOT NULL, ev.order_id, ev.kind
             FROM upd JOIN push_devices p ON p.id = upd.device_id
                      JOIN order_events ev ON ev.id = upd.event_id",
            &[&(limit as i64), &lease.as_secs_f64()],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ClaimedNotice {
            notice_id: r.get(0),
            attempts: r.get::<_, i32>(1) as u32,
            first_attempt_at: r.get(2),
            device_id: r.get(3),
            token: r.get(4),
            retired: r.get(5),
            order_id: r.get(6),
            kind: r.get(7),
        })
        .collect())
}

/// The end of one push attempt, as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NoticeOutcome {
    Sent {
        status: u16,
    },
    Retry {
        after: Duration,
        status: Option<u16>,
        error: String,
    },
    Dead {
        status: Option<u16>,
        error: String,
    },
    /// The provider says the device token is dead: the device is retired, its pending notices
    /// skipped, and no notice is made for it again.
    Unregistered {
        status: u16,
    },
    /// Not sent: the device was retired meanwhile.
    Skipped,
}

pub(crate) async fn complete_notice(
    db: &mut Client,
    n: &ClaimedNotice,
    outcome: &NoticeOutcome,
) -> Result<(), tokio_postgres::Error> {
    let tx = db.transaction().await?;
    let (state, status, error, after): (&str, Option<u16>, Option<&str>, f64) = match outcome {
        NoticeOutcome::Sent { status } => ("sent", Some(*status), None, 0.0),
        NoticeOutcome::Retry {
            after,
            status,
            error,
        } => (
            "pending",
            *status,
            Some(error.as_str()),
            after.as_secs_f64(),
        ),
        NoticeOutcome::Dead { status, error } => ("dead", *status, Some(error.as_str()), 0.0),
        NoticeOutcome::Unregistered { status } => (
            "dead",
            Some(*status),
            Some("device token unregistered"),
            0.0,
        ),
        NoticeOutcome::Skipped => ("skipped", None, Some("device retired"), 0.0),
    };
    tx.execute(
        "UPDATE push_notices SET state = $2, last_status = $3, last_error = $4,
             next_attempt_at = now() + make_interval(secs => $5),
             done_at = CASE WHEN $2 = 'pending' THEN NULL ELSE now() END
         WHERE id = $1",
        &[&n.notice_id, &state, &status.map(i32::from), &error, &after],
    )
    .await?;
    if matches!(outcome, NoticeOutcome::Unregistered { .. }) {
        tx.execute(
            "UPDATE push_devices SET retired_at = now() WHERE id = $1 AND retired_at IS NULL",
            &[&n.device_id],
        )
        .await?;
        tx.execute(
            "UPDATE push_notices SET state = 'skipped', last_error = 'device retired', done_at = now()
             WHERE device_id = $1 AND state = 'pending'",
            &[&n.device_id],
        )
        .await?;
    }
    tx.commit().await
}

/// Registers a customer's device token for one order of `tenant` (again: the same row).
pub(crate) async fn register_device(
    db: &Client,
    tenant: &str,
    order: &str,
    token: &str,
) -> Result<(i64, bool), tokio_postgres::Error> {
    let r = db
        .query_one(
            "INSERT INTO push_devices (tenant, order_id, token) VALUES ($1, $2, $3)
             ON CONFLICT (order_id, token) DO UPDATE SET tenant = push_devices.tenant
             RETURNING id, retired_at IS NOT NULL",
            &[&tenant, &order, &token],
        )
        .await?;
    Ok((r.get(0), r.get(1)))
}

/// The notices of one order of `tenant`: (device id, kind, state, attempts).
pub(crate) async fn notices(
    db: &Client,
    tenant: &str,
    order: &str,
) -> Result<Vec<(i64, String, String, i32)>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT p.id, n.kind, n.state, n.attempts FROM push_notices n
             JOIN push_devices p ON p.id = n.device_id
             WHERE p.tenant = $1 AND p.order_id = $2 ORDER BY n.id",
            &[&tenant, &order],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect())
}
