//! Redis key names.

/// The Redis keys of one deployment. The default prefix is empty, giving the names of the
/// design (`couriers:live`, ...). A prefix such as `{riyadh}:` puts every key into one Redis
/// Cluster slot, so the batch script touches a single slot; tests use a random prefix to stay
/// apart from each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// GEO set: last accepted location per courier.
    pub live: String,
    /// ZSET: server time of each courier's last accepted point, written once per
    /// `ingest.seen_every` bucket (so within one bucket of it; the exact time is in `seq`): the
    /// eviction sweep's index.
    pub seen: String,
    /// HASH: courier id -> the orders he carries, comma-separated, oldest first (one order:
    /// its id alone).
    pub order: String,
    /// HASH: courier id -> seq state used by the batch script ([`crate::SeqState`]; see
    /// docs/rules.md).
    pub seq: String,
    /// HASH: order id -> courier id while the order runs (the reverse of `order`).
    pub order_courier: String,
    /// ZSET: ended (delivered) orders, score = end time; trimmed after the token lifetime.
    pub orders_ended: String,
    /// Prefix of the idempotency records of order events: `<this><order>:<Idempotency-Key>`.
    pub order_event_idem: String,
    /// Pub/sub channel on which an ended order id is announced to every gateway process.
    pub orders_ended_channel: String,
    /// Prefix of the batch script's records: `<this><batch id>` holds one batch's verdicts for
    /// 30 s, so a batch retried after a timeout gets the verdicts of its first run.
    pub batch_record: String,
    /// STREAM: order events waiting for the notify relay (bounded: see `events_dropped`).
    pub events: String,
    /// Counter (string): order events not written because `events` held its cap.
    pub events_dropped: String,
    /// HASH: order id -> tenant (the order service that assigned it) while the order runs.
    pub order_tenant: String,
    /// HASH: order id -> its places and which arrivals were reported
    /// ([`crate::events::Places`]) while the order runs.
    pub order_places: String,
}

impl Keys {
    pub fn with_prefix(prefix: &str) -> Self {
        Keys {
            live: format!("{prefix}couriers:live"),
            seen: format!("{prefix}couriers:seen"),
            order: format!("{prefix}courier:order"),
            seq: format!("{prefix}couriers:seq"),
            order_courier: format!("{prefix}order:courier"),
            orders_ended: format!("{prefix}orders:ended"),
            order_event_idem: format!("{prefix}order:event:"),
            orders_ended_channel: format!("{prefix}orders:ended:channel"),
            batch_record: format!("{prefix}ingest:batch:"),
            events: format!("{prefix}events"),
            events_dropped: format!("{prefix}events:dropped"),
            order_tenant: format!("{prefix}order:tenant"),
            order_places: format!("{prefix}order:places"),
        }
    }
}

impl Keys {
    /// The prefix every name starts with (on a Redis Cluster it must carry a hash tag).
    pub fn prefix(&self) -> &str {
        self.live.strip_suffix("couriers:live").unwrap_or("")
    }
}

impl Default for Keys {
    fn default() -> Self {
        Keys::with_prefix("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_match_the_design() {
        let k = Keys::default();
        assert_eq!(k.live, "couriers:live");
        assert_eq!(k.seen, "couriers:seen");
        assert_eq!(k.order, "courier:order");
        assert_eq!(k.seq, "couriers:seq");
        assert_eq!(k.order_courier, "order:courier");
        assert_eq!(k.orders_ended, "orders:ended");
    }

    #[test]
    fn prefix_applies_to_every_key() {
        let k = Keys::with_prefix("{riyadh}:");
        for key in [
            &k.live,
            &k.seen,
            &k.order,
            &k.seq,
            &k.order_courier,
            &k.orders_ended,
            &k.order_event_idem,
            &k.orders_ended_channel,
            &k.batch_record,
            &k.events,
            &k.events_dropped,
            &k.order_tenant,
            &k.order_places,
        ] {
            assert!(key.starts_with("{riyadh}:"), "{key}");
        }
        assert_eq!(k.prefix(), "{riyadh}:");
        assert_eq!(Keys::default().prefix(), "");
    }
}
