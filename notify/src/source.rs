//! The relay: order events from the Redis events stream (written by the orders API's scripts,
//! `fanout/src/emit.lua`) into the PostgreSQL outbox, at least once.
//!
//! An entry is acknowledged and deleted from the stream only after the outbox commit that
//! holds it, so a relay that dies (or a PostgreSQL that is down) leaves its entries pending;
//! a live relay of the same group claims them after `relay_claim_after` (XAUTOCLAIM). An entry
//! recorded twice that way is one outbox row (unique dedupe key). Several relay processes
//! share the consumer group.
//!
//! `parse` is the pure part; the loop in `run` is the I/O.

use crate::config::NotifyConfig;
use crate::events::Stats;
use crate::NotifyError;
use courier_wire::Keys;
use courier_wire::{RedisConn, RedisOptions, RedisTarget};
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One event as the stream holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StreamEvent {
    /// The stream entry id (acknowledged once recorded).
    pub entry: String,
    pub kind: String,
    pub key: String,
    pub order: String,
    pub courier: Option<String>,
    pub tenant: String,
    /// Unix seconds.
    pub at: f64,
}

fn text(e: &StreamId, field: &str) -> Option<String> {
    match e.map.get(field)? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// An entry's fields, or why it is unusable (every field is written by `emit.lua`, so this is
/// a foreign or corrupted entry).
pub(crate) fn parse(e: &StreamId) -> Result<StreamEvent, &'static str> {
    let need = |f| text(e, f).filter(|v| !v.is_empty()).ok_or("missing field");
    let at: f64 = need("at")?.parse().map_err(|_| "bad time")?;
    if !at.is_finite() || at <= 0.0 {
        return Err("bad time");
    }
    Ok(StreamEvent {
        entry: e.id.clone(),
        kind: need("kind")?,
        key: need("key")?,
        order: need("order")?,
        courier: text(e, "courier").filter(|c| !c.is_empty()),
        tenant: need("tenant")?,
        at,
    })
}

/// The relay's Redis side.
pub(crate) struct Relay {
    pub redis: RedisTarget,
    pub database_url: String,
    pub keys: Keys,
    pub config: NotifyConfig,
    pub stats: Arc<Stats>,
    pub consumer: String,
}

impl Relay {
    async fn connect(&self) -> Result<RedisConn, NotifyError> {
        self.redis
            .check_prefix(self.keys.prefix())
            .map_err(|e| NotifyError::Config(format!("redis.key_prefix {e}")))?;
        // Its own connection: XREADGROUP BLOCK would hold up every other command of a shared
        // multiplexed one. The response timeout outlives the block.
        let options = RedisOptions {
            response_timeout: Duration::from_secs(5),
            ..RedisOptions::default()
        };
        let mut conn = RedisConn::connect(&self.redis, &options).await?;
        let made: Result<(), redis::RedisError> = conn
            .xgroup_create_mkstream(&self.keys.events, &self.config.group, "0")
            .await;
        match made {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
        Ok(conn)
    }

    /// Moves events until `shutdown`; Redis and PostgreSQL outages are waited out.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), NotifyError> {
        let mut redis: Option<RedisConn> = None;
        let mut db: Option<tokio_postgres::Client> = None;
        let mut held: Vec<StreamEvent> = Vec::new();
        let mut last_claim = tokio::time::Instant::now() - self.config.relay_claim_after;
        while !shutdown.is_cancelled() {
            match self
                .round(&mut redis, &mut db, &mut held, &mut last_claim)
                .await
            {
                Ok(()) => {}
                // The stream or the group was deleted under a blocked read (an operator's DEL,
                // a flushed Redis): connecting again makes both anew.
                Err(NotifyError::Redis(e)) if matches!(e.code(), Some("UNBLOCKED" | "NOGROUP")) => {
                    tracing::info!(error = %e, "notify relay: the events stream went away; making it again");
                    redis = None;
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "notify relay: waiting for storage");
                    if matches!(e, NotifyError::Redis(_)) {
                        redis = None;
                    } else {
                        db = None;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
        // What is held stays pending in the stream: the next relay records it.
        Ok(())
    }

    async fn round(
        &self,
        redis: &mut Option<RedisConn>,
        db: &mut Option<tokio_postgres::Client>,
        held: &mut Vec<StreamEvent>,
        last_claim: &mut tokio::time::Instant,
    ) -> Result<(), NotifyError> {
        if redis.is_none() {
            *redis = Some(self.connect().await?);
        }
        let conn = redis.as_mut().expect("connected above");
        if held.is_empty() {
            let mut entries = Vec::new();
            if last_claim.elapsed() >= self.config.relay_claim_after {
                *last_claim = tokio::time::Instant::now();
                let r: StreamAutoClaimReply = conn
                    .xautoclaim_options(
                        &self.keys.events,
                        &self.config.group,
                        &self.consumer,
                        self.config.relay_claim_after.as_millis() as u64,
                        "0-0",
                        StreamAutoClaimOptions::default().count(self.config.relay_batch),
                    )
                    .await?;
                entries = r.claimed;
            }
            if entries.is_empty() {
                let opts = StreamReadOptions::default()
                    .group(&self.config.group, &self.consumer)
                    .count(self.config.relay_batch)
                    .block(1000);
                let r: Option<StreamReadReply> = conn
                    .xread_options(&[&self.keys.events], &[">"], &opts)
                    .await?;
                entries = r
                    .into_iter()
                    .flat_map(|r| r.keys)
                    .flat_map(|k| k.ids)
                    .collect();
            }
            let mut bad = Vec::new();
            for e in &entries {
                match parse(e) {
                    Ok(ev) => held.push(ev),
                    Err(why) => {
                        tracing::warn!(entry = %e.id, why, "notify relay: unusable stream entry dropped");
                        self.stats.event("", "invalid");
                        bad.push(e.id.clone());
                    }
                }
            }
            if !bad.is_empty() {
                self.ack(conn, &bad).await?;
            }
            let (len, dropped): (u64, Option<u64>) = redis::pipe()
                .xlen(&self.keys.events)
                .get(&self.keys.events_dropped)
                .query_async(conn)
                .await?;
            crate::events::stream(len, dropped.unwrap_or(0));
        }
        if held.is_empty() {
            return Ok(());
        }
        if db.is_none() {
            let mut c =
                history_writer::sink::connect(&self.database_url, "courier-pipeline notify relay")
                    .await?;
            history_writer::migrate(&mut c).await?;
            *db = Some(c);
        }
        let db = db.as_ref().expect("connected above");
        let kinds = self.config.notice_kinds();
        match crate::outbox::record(db, held, kinds).await {
            Ok((_, new)) => {
                for e in held.iter() {
                    let result = if new.contains(&e.key) {
                        "recorded"
                    } else {
                        "duplicate"
                    };
                    self.stats.event(&e.kind, result);
                }
            }
            Err(e) => {
                let e = NotifyError::from(e);
                if e.is_retryable() {
                    // Kept in `held`: the next round writes them again.
                    return Err(e);
                }
                // PostgreSQL refuses the data itself: one event at a time, so that only the
                // one it refuses is dropped (counted), not the batch.
                for e in held.iter() {
                    match crate::outbox::record(db, std::slice::from_ref(e), kinds).await {
                        Ok((r, _)) => {
                            let result = if r.events == 1 {
                                "recorded"
                            } else {
                                "duplicate"
                            };
                            self.stats.event(&e.kind, result);
                        }
                        Err(err) => {
                            let err = NotifyError::from(err);
                            if err.is_retryable() {
                                // The ones recorded already are duplicates next time.
                                return Err(err);
                            }
                            tracing::warn!(error = %err, kind = %e.kind, "notify relay: PostgreSQL refused an event; dropped");
                            self.stats.event(&e.kind, "invalid");
                        }
                    }
                }
            }
        }
        let ids: Vec<String> = held.iter().map(|e| e.entry.clone()).collect();
        held.clear();
        // Recorded: a failure from here on leaves them pending, recorded again (a duplicate).
        self.ack(conn, &ids).await
    }

    async fn ack(&self, conn: &mut RedisConn, ids: &[String]) -> Result<(), NotifyError> {
        let _: (u64, u64) = redis::pipe()
            .xack(&self.keys.events, &self.config.group, ids)
            .xdel(&self.keys.events, ids)
            .query_async(conn)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> StreamId {
        StreamId {
            id: "1-0".into(),
            map: fields
                .iter()
                .map(|(k, v)| (k.to_string(), Value::BulkString(v.as_bytes().to_vec())))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn entries_written_by_emit_lua_parse_and_others_are_refused() {
        let full = [
            ("kind", "order.delivered"),
            ("key", "order.delivered:o-1"),
            ("order", "o-1"),
            ("courier", "c-1"),
            ("tenant", "acme"),
            ("at", "1700000000.5"),
        ];
        let e = parse(&entry(&full)).unwrap();
        assert_eq!(e.kind, "order.delivered");
        assert_eq!(e.courier.as_deref(), Some("c-1"));
        assert_eq!(e.at, 1_700_000_000.5);
        assert_eq!(parse(&entry(&full[1..])), Err("missing field"));
        let mut bad_time = full;
        bad_time[5] = ("at", "NaN");
        assert_eq!(parse(&entry(&bad_time)), Err("bad time"));
        let mut no_courier = full;
        no_courier[3] = ("courier", "");
        assert_eq!(parse(&entry(&no_courier)).unwrap().courier, None);
    }
}
