//! Errors of the maps at start-up and per request, split into what a retry can mend.

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// Redis refused or dropped a call.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A setting that cannot work.
    #[error("config: {0}")]
    Config(String),
}

impl WebError {
    /// True when the same call may succeed later (connection lost, server busy).
    pub fn is_retryable(&self) -> bool {
        match self {
            WebError::Redis(e) => e.is_io_error() || e.is_connection_dropped() || e.is_timeout(),
            WebError::Config(_) => false,
        }
    }
}
