//! Errors at the notify boundary, split into what a retry can mend and what it cannot.

use history_writer::HistoryError;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// PostgreSQL (through the history crate's connection and error text, which never holds a
    /// row's values).
    #[error("{0}")]
    Postgres(#[from] HistoryError),
    #[error("config: {0}")]
    Config(String),
}

impl From<tokio_postgres::Error> for NotifyError {
    fn from(e: tokio_postgres::Error) -> Self {
        NotifyError::Postgres(HistoryError::Postgres(e))
    }
}

impl NotifyError {
    /// True when the same call may succeed later.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            NotifyError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
            }
            NotifyError::Postgres(e) => e.is_retryable(),
            NotifyError::Config(_) => false,
        }
    }
}
