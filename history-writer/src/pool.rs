//! The PostgreSQL pool of the HTTP APIs (trail, aggregates, erasure): deadpool-postgres, a
//! maintained pool for tokio-postgres, in place of the trail API's own idle list and semaphore
//! (and of the aggregate and erasure APIs' connection per request). The writer keeps its own
//! connections (`sink`): COPY batches and their retries are not request-shaped.

use crate::error::HistoryError;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres::NoTls;

/// How long a request waits for a free connection, and for a new one to connect.
const WAIT: Duration = Duration::from_secs(10);
const CONNECT: Duration = Duration::from_secs(6);

/// A pool of at most `max` connections to `url`, named `application` in `pg_stat_activity`;
/// connects on demand, checks a connection is open before lending it again.
pub(crate) fn pool(url: &str, application: &str, max: usize) -> Result<Pool, HistoryError> {
    let mut cfg = tokio_postgres::Config::from_str(url)?;
    cfg.connect_timeout(Duration::from_secs(5))
        .application_name(application);
    let manager = Manager::from_config(
        cfg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max.max(1))
        .wait_timeout(Some(WAIT))
        .create_timeout(Some(CONNECT))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| HistoryError::Config(format!("postgres pool: {e}")))
}

/// A connection from `pool`, or why there is none (retryable: down, or every one busy).
pub(crate) async fn get(pool: &Pool) -> Result<deadpool_postgres::Object, HistoryError> {
    pool.get().await.map_err(|e| match e {
        deadpool_postgres::PoolError::Backend(e) => HistoryError::Postgres(e),
        deadpool_postgres::PoolError::Timeout(_) => {
            HistoryError::Timeout("no database connection free or made in time")
        }
        other => HistoryError::Config(format!("postgres pool: {other}")),
    })
}
