//! The Redis edge of ingest: the batch script (EVALSHA, loading it on NOSCRIPT), eviction and
//! seq-state upkeep. One [`RedisConn`] (one server or a cluster) is cloned into every call: it
//! multiplexes and reconnects by itself. Every script declares all its keys in KEYS, all under
//! the key prefix, so on a cluster the call is routed to the slot of the first key and the
//! others are in that slot too (the prefix's hash tag, checked at start-up).

use crate::error::IngestError;
use courier_wire::events::with_emit;
use courier_wire::{Keys, RedisConn, RedisOptions, RedisTarget};
use redis::{Cmd, Script, Value};
use std::sync::Arc;

const BATCH_LUA: &str = include_str!("script.lua");
const EVICT_LUA: &str = include_str!("evict.lua");
const FORGET_LUA: &str = include_str!("forget.lua");
const ARRIVE_LUA: &str = include_str!("arrive.lua");

/// The batch script as Redis runs it (with the events prelude), for tests and benches.
pub fn batch_lua() -> String {
    with_emit(BATCH_LUA)
}

/// The eviction sweep's script as Redis runs it, for tests; KEYS as in [`RedisSink::evict`].
pub fn evict_lua() -> String {
    with_emit(EVICT_LUA)
}

/// The batch script's KEYS, in the order of its header; `record` names this batch's record
/// (`Keys::batch_record` + the batch id). Its ARGV: [`crate::batch::script_call`]'s, then the
/// events cap.
pub fn batch_keys<'k>(k: &'k Keys, record: &'k str) -> [&'k str; 9] {
    [
        &k.live,
        &k.seen,
        &k.order,
        &k.seq,
        record,
        &k.order_places,
        &k.order_tenant,
        &k.events,
        &k.events_dropped,
    ]
}

/// Connection plus the four scripts of ingest.
#[derive(Clone)]
pub struct RedisSink {
    conn: RedisConn,
    keys: Keys,
    /// Cap of the events stream (`notify.stream_max`; 0: no events).
    events_cap: u64,
    batch: Lua,
    evict: Lua,
    forget: Lua,
    arrive: Lua,
}

/// A script and its source (for SCRIPT LOAD).
#[derive(Clone)]
struct Lua {
    script: Script,
    code: Arc<str>,
}

impl Lua {
    fn new(code: String) -> Self {
        Lua {
            script: Script::new(&code),
            code: code.into(),
        }
    }
}

impl RedisSink {
    /// Connects (failing fast when Redis is unreachable at start-up) and loads the scripts.
    pub(crate) async fn connect(
        target: &RedisTarget,
        keys: Keys,
        events_cap: u64,
    ) -> Result<Self, IngestError> {
        target
            .check_prefix(keys.prefix())
            .map_err(|e| IngestError::Config(format!("redis.key_prefix {e}")))?;
        let conn = RedisConn::connect(target, &RedisOptions::default()).await?;
        let sink = RedisSink {
            conn,
            keys,
            events_cap,
            batch: Lua::new(batch_lua()),
            evict: Lua::new(with_emit(EVICT_LUA)),
            forget: Lua::new(FORGET_LUA.to_string()),
            arrive: Lua::new(with_emit(ARRIVE_LUA)),
        };
        for s in [&sink.batch, &sink.evict, &sink.forget, &sink.arrive] {
            sink.load(s).await?;
        }
        Ok(sink)
    }

    /// SCRIPT LOAD goes to every node of a cluster, replicas included, so a promoted replica
    /// has the scripts already; one restarted empty answers NOSCRIPT and [`Self::run`] loads.
    async fn load(&self, script: &Lua) -> Result<(), IngestError> {
        let mut c = self.conn.clone();
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&*script.code)
            .query_async(&mut c)
            .await?;
        Ok(())
    }

    fn evalsha(script: &Lua, keys: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.script.get_hash()).arg(keys.len()).arg(keys);
        cmd
    }

    /// Runs a prepared EVALSHA; when the server lost the script (restart, SCRIPT FLUSH, a
    /// failover to a replica that never saw it) loads it and runs the call once more.
    async fn run(&self, script: &Lua, cmd: &Cmd) -> Result<Value, IngestError> {
        let mut c = self.conn.clone();
        match cmd.query_async::<Value>(&mut c).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load(script).await?;
                Ok(cmd.query_async::<Value>(&mut c).await?)
            }
            other => Ok(other?),
        }
    }

    /// Runs the batch script; `args` come from [`crate::batch::script_call`]. `batch_id` names
    /// the batch across its retries (see the script's record key): the same id gets the same
    /// verdicts.
    pub async fn batch(&self, batch_id: &str, args: &[Vec<u8>]) -> Result<Vec<Value>, IngestError> {
        let k = &self.keys;
        let record = format!("{}{batch_id}", k.batch_record);
        let mut cmd = Self::evalsha(&self.batch, &batch_keys(k, &record));
        cmd.arg(args).arg(self.events_cap);
        match self.run(&self.batch, &cmd).await? {
            Value::Array(v) => Ok(v),
            other => Err(IngestError::Reply(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }

    /// Examines up to `limit` couriers whose `seen` score is before `cutoff` and removes those
    /// whose seq state confirms it (the others are re-scored); returns (removed, examined).
    pub(crate) async fn evict(&self, cutoff: f64, limit: usize) -> Result<(u64, u64), IngestError> {
        let k = &self.keys;
        let keys = [
            &k.live,
            &k.seen,
            &k.order,
            &k.order_tenant,
            &k.events,
            &k.events_dropped,
            &k.seq,
        ];
        let mut cmd = Self::evalsha(&self.evict, &keys.map(String::as_str));
        cmd.arg(cutoff)
            .arg(limit)
            .arg(self.events_cap)
            .arg(courier_wire::clock::unix_now());
        let v = self.run(&self.evict, &cmd).await?;
        redis::from_redis_value::<(u64, u64)>(v.clone())
            .map_err(|_| IngestError::Reply(format!("evict returned {v:?}")))
    }

    /// Writes the arrival events a batch decided: (order, courier, place flag) each; returns
    /// how many were new (each order and place is reported once).
    pub(crate) async fn arrive(&self, arrivals: &[(&str, &str, &str)]) -> Result<u64, IngestError> {
        let k = &self.keys;
        let keys = [
            &k.order_places,
            &k.order_courier,
            &k.order_tenant,
            &k.events,
            &k.events_dropped,
        ];
        let mut cmd = Self::evalsha(&self.arrive, &keys.map(String::as_str));
        cmd.arg(self.events_cap)
            .arg(courier_wire::clock::unix_now());
        for (order, courier, place) in arrivals {
            cmd.arg(*order).arg(*courier).arg(*place);
        }
        match self.run(&self.arrive, &cmd).await? {
            Value::Int(n) => Ok(n.max(0) as u64),
            other => Err(IngestError::Reply(format!("arrive returned {other:?}"))),
        }
    }

    /// One HSCAN step of forgetting old seq state; returns (next cursor, removed).
    pub(crate) async fn forget(
        &self,
        cursor: u64,
        cutoff: f64,
        count: usize,
    ) -> Result<(u64, u64), IngestError> {
        let mut cmd = Self::evalsha(&self.forget, &[&self.keys.seq]);
        cmd.arg(cursor).arg(cutoff).arg(count);
        let v = self.run(&self.forget, &cmd).await?;
        let (next, removed): (String, u64) =
            redis::from_redis_value(v).map_err(|e| IngestError::Reply(e.to_string()))?;
        let next = next
            .parse()
            .map_err(|_| IngestError::Reply(format!("bad HSCAN cursor {next:?}")))?;
        Ok((next, removed))
    }
}
