//! The error of a setting that cannot work, shared by every role's `validate`: the setting's
//! name (as the file spells it, `ingest.batch_max`, or the environment, `REDIS_URL`) and why,
//! so that start-up stops with one line naming it.

/// A setting that cannot work, with its name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct ConfigError {
    pub setting: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(setting: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            setting: setting.into(),
            reason: reason.into(),
        }
    }
}
