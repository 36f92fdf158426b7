//! Where a deployment's Redis is: one server, or the seed nodes of a Redis Cluster. Pure: the
//! connection itself is [`crate::redis_conn`] (feature `redis`).

/// A validated Redis location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis.url`).
    Single(String),
    /// A Redis Cluster, found through these seed nodes (`redis.cluster_nodes`): any one that
    /// answers gives the client the whole slot map, so a seed that is down at start-up is fine.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// One server at `url`, unchecked (tests and benches that build it from a known URL).
    pub fn single(url: impl Into<String>) -> Self {
        RedisTarget::Single(url.into())
    }

    /// One server at `url`: a `redis://`, `rediss://` or `unix://` URL.
    pub fn parse_single(url: &str) -> Result<Self, String> {
        check_url(url)?;
        Ok(RedisTarget::Single(url.to_string()))
    }

    /// A cluster from its seed nodes (each a `redis://` or `rediss://` URL; at least one).
    pub fn parse_cluster<S: AsRef<str>>(nodes: &[S]) -> Result<Self, String> {
        let nodes: Vec<String> = nodes
            .iter()
            .map(|n| n.as_ref().trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if nodes.is_empty() {
            return Err("names no seed node".into());
        }
        for n in &nodes {
            check_url(n)?;
            if n.starts_with("unix://") {
                return Err(format!("{n:?}: cluster nodes are reached over TCP"));
            }
        }
        Ok(RedisTarget::Cluster(nodes))
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// The URLs given: the server, or the seeds. A plain connection to any of them carries
    /// classic pub/sub on a cluster (PUBLISH reaches every node).
    pub fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Single(u) => std::slice::from_ref(u),
            RedisTarget::Cluster(n) => n,
        }
    }

    /// On a cluster every key of one script call must hash to one slot, which holds when
    /// every key name starts with a prefix carrying a hash tag (`{riyadh}:`). A single server
    /// takes any prefix.
    pub fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        if self.is_cluster() && hash_tag(prefix).is_none() {
            return Err(format!(
                "{prefix:?} has no hash tag: on a Redis Cluster the key prefix must hold one, \
                 such as \"{{riyadh}}:\", so that every key of a city is in one slot"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for RedisTarget {
    /// The locations without any password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hide = |u: &str| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}://***@{}", &u[..s], &u[at + 1..]),
            _ => u.to_string(),
        };
        match self {
            RedisTarget::Single(u) => write!(f, "{}", hide(u)),
            RedisTarget::Cluster(n) => {
                let n: Vec<String> = n.iter().map(|u| hide(u)).collect();
                write!(f, "cluster [{}]", n.join(", "))
            }
        }
    }
}

fn check_url(url: &str) -> Result<(), String> {
    if ["redis://", "rediss://", "unix://"]
        .iter()
        .any(|s| url.starts_with(s))
    {
        Ok(())
    } else {
        Err(format!("{url:?} is not a redis:// URL"))
    }
}

/// The part of `key` Redis Cluster hashes, by its rule: what lies between the first `{` and
/// the first `}` after it, if that is not empty. `None`: the whole key is hashed.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Keys;

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        assert_eq!(hash_tag("{riyadh}:couriers:live"), Some("riyadh"));
        assert_eq!(hash_tag("city:{jeddah}:x"), Some("jeddah"));
        assert_eq!(
            hash_tag("{}:x{a}"),
            None,
            "an empty first tag hashes the whole key"
        );
        assert_eq!(hash_tag("{riyadh:x"), None);
        assert_eq!(hash_tag("couriers:live"), None);
        assert_eq!(hash_tag("{a}{b}"), Some("a"));
    }

    /// Every key a script call touches starts with the prefix, so it carries the prefix's tag
    /// whatever follows (an order id or idempotency key with braces included).
    #[test]
    fn every_key_of_a_tagged_prefix_has_its_tag() {
        let k = Keys::with_prefix("{riyadh}:");
        let record = format!("{}o{{x}}1:key}}", k.order_event_idem);
        let batch = format!("{}0123abc", k.batch_record);
        for key in [
            &k.live,
            &k.seen,
            &k.order,
            &k.seq,
            &k.order_courier,
            &k.orders_ended,
            &record,
            &batch,
        ] {
            assert_eq!(hash_tag(key), Some("riyadh"), "{key}");
        }
    }

    #[test]
    fn a_cluster_refuses_a_prefix_without_a_tag() {
        let c = RedisTarget::parse_cluster(&["redis://127.0.0.1:7000"]).unwrap();
        assert!(c.check_prefix("{riyadh}:").is_ok());
        for bad in ["", "riyadh:", "{}:", "{riyadh:"] {
            let e = c.check_prefix(bad).unwrap_err();
            assert!(e.contains("hash tag"), "{bad}: {e}");
        }
        assert!(RedisTarget::single("redis://x/").check_prefix("").is_ok());
    }

    #[test]
    fn cluster_seeds_are_checked() {
        let c = RedisTarget::parse_cluster(&[" redis://a:1 ", "", "redis://b:2"]).unwrap();
        assert_eq!(c.urls(), ["redis://a:1", "redis://b:2"]);
        assert!(RedisTarget::parse_cluster::<&str>(&[]).is_err());
        assert!(RedisTarget::parse_cluster(&[""]).is_err());
        assert!(RedisTarget::parse_cluster(&["a:1"])
            .unwrap_err()
            .contains("not a redis:// URL"));
        assert!(RedisTarget::parse_cluster(&["unix:///tmp/r.sock"]).is_err());
        assert!(RedisTarget::parse_single("localhost").is_err());
    }

    #[test]
    fn display_hides_passwords() {
        let c = RedisTarget::parse_cluster(&["redis://:secret@a:1", "redis://b:2"]).unwrap();
        let s = c.to_string();
        assert!(!s.contains("secret"), "{s}");
        assert_eq!(s, "cluster [redis://***@a:1, redis://b:2]");
    }
}
