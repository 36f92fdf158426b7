//! The Redis connection every role uses (feature `redis`): one server through redis-rs's
//! `ConnectionManager`, or a Redis Cluster through its async cluster connection. Both
//! multiplex, are cheap to clone and reconnect by themselves; the cluster one also follows
//! MOVED/ASK and reloads the slot map when a primary fails over. Commands, pipelines and
//! `Script`s run on either, as on any `ConnectionLike`.

use crate::RedisTarget;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::time::Duration;

/// How patient the client is before a call fails to the role (which has its own retries,
/// e.g. ingest's `redis_retry_for`).
#[derive(Debug, Clone, Copy)]
pub struct RedisOptions {
    pub connection_timeout: Duration,
    pub response_timeout: Duration,
    /// Reconnect attempts (one server) or redirections and reconnects (cluster) per call.
    pub retries: u32,
}

impl Default for RedisOptions {
    /// 2 s to connect, 2 s for an answer, 2 retries: what every role used before clusters.
    fn default() -> Self {
        RedisOptions {
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            retries: 2,
        }
    }
}

/// A connection to a [`RedisTarget`].
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// Connects now: an error if no server (or no seed node) answers.
    pub async fn connect(target: &RedisTarget, o: &RedisOptions) -> RedisResult<Self> {
        match target {
            RedisTarget::Single(url) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(o.connection_timeout))
                    .set_response_timeout(Some(o.response_timeout))
                    .set_number_of_retries(o.retries as usize);
                let client = redis::Client::open(url.as_str())?;
                Ok(RedisConn::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            RedisTarget::Cluster(nodes) => {
                // redis-rs waits at least 1.28 s between cluster retries by default; a failover
                // is over in well under that once a replica is promoted, and the roles retry
                // themselves, so short waits keep a call's worst case near what one server has.
                let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(o.connection_timeout)
                    .response_timeout(o.response_timeout)
                    .retries(o.retries.max(1) * 2)
                    .min_retry_wait(50)
                    .max_retry_wait(250)
                    .build()?;
                Ok(RedisConn::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}
