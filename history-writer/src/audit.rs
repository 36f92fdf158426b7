//! Retention of the audit logs: `trail_access_log` and `erasure_log` name couriers (and what
//! was done to their data), so they are kept `audit_retention_days`, then deleted.

use crate::error::HistoryError;
use crate::rows::system_time;
use tokio_postgres::GenericClient;

/// Rows deleted from each log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    pub trail_access: u64,
    pub erasure: u64,
}

/// Deletes the audit rows older than `days` at `now`.
pub async fn expire(
    client: &impl GenericClient,
    now: f64,
    days: u32,
) -> Result<Expired, HistoryError> {
    let cutoff = system_time(now - f64::from(days) * 86_400.0);
    let trail_access = client
        .execute(
            "DELETE FROM trail_access_log WHERE accessed_at < $1",
            &[&cutoff],
        )
        .await?;
    let erasure = client
        .execute("DELETE FROM erasure_log WHERE erased_at < $1", &[&cutoff])
        .await?;
    Ok(Expired {
        trail_access,
        erasure,
    })
}
