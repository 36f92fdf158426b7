//! Schema migrations: the numbered files of `sql/`, embedded in the binary, applied in order
//! and recorded in `schema_migrations`. Idempotent (applied versions are skipped) and safe when
//! several processes start together: the whole run holds a transaction-scoped advisory lock,
//! so the second one waits, then finds everything applied. Everything lands in the first
//! schema of the connection's `search_path`.

use crate::error::HistoryError;
use tokio_postgres::Client;

/// One migration: its number, name and SQL.
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, in order. A new one gets the next number; applied ones never change.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "courier_points",
        sql: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../sql/0001_courier_points.sql"
        )),
    },
    Migration {
        version: 2,
        name: "trail_access_log",
        sql: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../sql/0002_trail_access_log.sql"
        )),
    },
    Migration {
        version: 3,
        name: "order_events",
        sql: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../sql/0003_order_events.sql"
        )),
    },
    Migration {
        version: 4,
        name: "privacy",
        sql: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../sql/0004_privacy.sql"
        )),
    },
    Migration {
        version: 5,
        name: "stacked_orders",
        sql: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../sql/0005_stacked_orders.sql"
        )),
    },
];

/// Applies the missing migrations in one transaction; returns the versions it applied.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, HistoryError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('courier-pipeline:migrations'), hashtext(current_schema()))",
        &[],
    )
    .await?;
    // Checked first rather than IF NOT EXISTS, which logs a NOTICE on every start.
    let exists: bool = tx
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        tx.batch_execute(
            "CREATE TABLE schema_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    }
    let applied: Vec<i32> = tx
        .query("SELECT version FROM schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut done = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| HistoryError::Migration {
                version: m.version,
                name: m.name,
                message: crate::error::pg_text(&e),
            })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await?;
        done.push(m.version);
    }
    tx.commit().await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_consecutive_from_one() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "{}", m.name);
            assert!(!m.sql.trim().is_empty());
        }
    }
}
