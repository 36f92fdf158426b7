//! Dispatch queries on the live index: "who is near this point now".
//!
//! ```text
//! ingest --GEOADD couriers:live, ZADD couriers:seen--> Redis <--GEOSEARCH (one Lua call)-- dispatch
//! ```
//!
//! The reference query searches in expanding rings (0.5, 1, 2, 5 km by default) until enough
//! couriers are found, nearest first, skipping couriers whose last point is older than a max
//! age. Small rings keep each search cheap where couriers are dense; `ANY` stops at the first
//! `count` members found, for hot spots where thousands stand on one point (without it Redis
//! sorts every member of the ring to return ten). `query` is the pure part (settings, reply
//! parsing); `search` is the Redis edge; `bench` measures it.

pub mod bench;
pub mod query;
pub mod search;

pub use query::{Found, Nearest, Query};
pub use search::Dispatch;

/// A dispatch failure.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// Redis refused or dropped the call.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The query cannot work (no rings, count 0, ...).
    #[error("query: {0}")]
    Query(String),
    /// The script answered something it never answers.
    #[error("nearest script reply: {0}")]
    Reply(String),
    /// A key prefix that cannot work on this Redis (a cluster needs a hash tag).
    #[error("redis.key_prefix {0}")]
    Prefix(String),
}

impl DispatchError {
    /// True when the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            DispatchError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
            }
            DispatchError::Query(_) | DispatchError::Reply(_) | DispatchError::Prefix(_) => false,
        }
    }
}
