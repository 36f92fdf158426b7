//! Errors at the fanout boundary, split into what a retry can mend and what it cannot.

/// A fanout failure.
#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    /// Redis refused or dropped a call.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A setting that cannot work (missing keys, bad values).
    #[error("config: {0}")]
    Config(String),
    /// The gateway's listener failed.
    #[error("gateway listener: {0}")]
    Listen(#[source] std::io::Error),
}

impl FanoutError {
    /// True when the same call may succeed later (connection lost, server busy).
    pub fn is_retryable(&self) -> bool {
        match self {
            FanoutError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
            }
            FanoutError::Listen(_) => true,
            FanoutError::Config(_) => false,
        }
    }
}
