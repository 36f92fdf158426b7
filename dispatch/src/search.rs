//! The Redis edge: one Lua call per query (ring searches and the last-seen check together, so
//! a query is one round trip however many rings it widens through).

use crate::query::{parse_reply, Nearest, Query, FETCH_MAX};
use crate::DispatchError;
use courier_wire::{Keys, RedisConn, RedisOptions, RedisTarget};

/// Answers dispatch queries on one multiplexed connection (cheap to clone; queries from many
/// tasks share it). A [`RedisConn`]: after Redis restarts, the next queries reconnect (a plain
/// multiplexed connection answered "broken pipe" for good: tests/it/faults.rs); on a cluster the
/// script goes to the slot of its first key, the live index (both keys share the prefix's tag).
#[derive(Clone)]
pub struct Dispatch {
    conn: RedisConn,
    keys: Keys,
    script: redis::Script,
}

impl Dispatch {
    /// Connects to one Redis or a cluster; `keys` names the live index (on a cluster its
    /// prefix must carry a hash tag).
    pub async fn connect(target: &RedisTarget, keys: Keys) -> Result<Dispatch, DispatchError> {
        target
            .check_prefix(keys.prefix())
            .map_err(DispatchError::Prefix)?;
        let conn = RedisConn::connect(target, &RedisOptions::default()).await?;
        Ok(Dispatch::new(conn, keys))
    }

    pub(crate) fn new(conn: RedisConn, keys: Keys) -> Dispatch {
        Dispatch {
            conn,
            keys,
            script: redis::Script::new(include_str!("nearest.lua")),
        }
    }

    /// The nearest couriers to the query's point, nearest first; `now` is the current unix
    /// time (the last-seen cut-off is `now - max_age`).
    pub async fn nearest(&self, q: &Query, now: f64) -> Result<Nearest, DispatchError> {
        q.validate()?;
        let min_seen = now - q.max_age.as_secs_f64();
        let mut inv = self.script.key(&self.keys.live);
        inv.key(&self.keys.seen)
            .key(&self.keys.seq)
            .arg(q.lon)
            .arg(q.lat)
            .arg(q.count)
            .arg(min_seen)
            .arg(if q.any { 1 } else { 0 })
            .arg(FETCH_MAX.max(q.count));
        for r in &q.radii_km {
            inv.arg(*r);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await?;
        let (ring, rest) = match reply.split_first() {
            Some((redis::Value::Int(ring), rest)) => {
                (*ring, rest.iter().map(text).collect::<Result<Vec<_>, _>>()?)
            }
            _ => return Err(DispatchError::Reply("no ring index first".into())),
        };
        parse_reply(ring, &rest, q.radii_km.len())
    }
}

fn text(v: &redis::Value) -> Result<String, DispatchError> {
    match v {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Ok(s.clone()),
        other => Err(DispatchError::Reply(format!("unexpected {other:?}"))),
    }
}
