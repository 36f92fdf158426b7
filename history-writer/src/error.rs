//! Errors at the history boundary, split into what a retry can mend and what it cannot.

use tokio_postgres::error::SqlState;

/// A history failure. Its text never holds a row's values: PostgreSQL's DETAIL lines
/// ("Failing row contains ...") can carry coordinates, so only the primary message is kept.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("postgres: {}", pg_text(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("postgres: {0}")]
    Timeout(&'static str),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("migration {version} ({name}): {message}")]
    Migration {
        version: i32,
        name: &'static str,
        message: String,
    },
    /// A setting that cannot work.
    #[error("config: {0}")]
    Config(String),
}

/// The primary message and SQLSTATE of a database error; the driver's text otherwise.
pub(crate) fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

impl HistoryError {
    /// True when the same statement may succeed later: the connection or the server is the
    /// problem (down, restarting, overloaded, a lock wait), not the data.
    pub fn is_retryable(&self) -> bool {
        match self {
            HistoryError::Postgres(e) => match e.code() {
                None => true, // I/O, closed connection, timeout
                Some(c) => {
                    let class = &c.code()[..2];
                    matches!(class, "08" | "40" | "53" | "57" | "58")
                        || *c == SqlState::LOCK_NOT_AVAILABLE
                        || *c == SqlState::QUERY_CANCELED
                }
            },
            HistoryError::Timeout(_) | HistoryError::Redis(_) => true,
            HistoryError::Migration { .. } | HistoryError::Config(_) => false,
        }
    }

    /// True when PostgreSQL refused the data itself (SQLSTATE class 22, data exception, or 23,
    /// integrity constraint): splitting the batch finds the row. Anything else that is not
    /// retryable (read-only after a failover 25006, a permission 42501, a missing table 42P01)
    /// is the database's state, not a row's: the batch is kept and retried, never dropped.
    pub(crate) fn is_row_fault(&self) -> bool {
        match self {
            HistoryError::Postgres(e) => e
                .code()
                .is_some_and(|c| matches!(&c.code()[..2], "22" | "23")),
            _ => false,
        }
    }

    /// True when a row's `received_at` had no partition (the whole COPY was refused).
    pub fn is_no_partition(&self) -> bool {
        match self {
            HistoryError::Postgres(e) => e.as_db_error().is_some_and(|db| {
                *db.code() == SqlState::CHECK_VIOLATION && db.message().starts_with("no partition")
            }),
            _ => false,
        }
    }
}
