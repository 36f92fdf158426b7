//! Errors at the ingest boundary, split into what a retry can mend and what it cannot.

/// An ingest failure.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Redis refused or dropped a call.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The batch script answered something it never answers: a bug or a foreign script.
    #[error("batch script reply: {0}")]
    Reply(String),
    /// A setting that cannot work.
    #[error("config: {0}")]
    Config(String),
}

impl IngestError {
    /// True when the same call may succeed later (connection lost, server busy).
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            IngestError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
            }
            IngestError::Reply(_) | IngestError::Config(_) => false,
        }
    }
}
