//! The PostgreSQL edge of the writer: one connection, one binary COPY per batch into the
//! partitioned parent, in a transaction. After ANY failure the client is dropped and a new one
//! connected on the next attempt: a failed COPY left open hangs the next query on that client.

use crate::error::HistoryError;
use crate::rows::{system_time, Row};
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

const COPY_SQL: &str =
    "COPY courier_points (courier_id, seq, phone_ts, received_at, order_id, order_ids, lat, lon) FROM STDIN (FORMAT binary)";
const COLUMN_TYPES: [Type; 8] = [
    Type::TEXT,
    Type::INT8,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
    Type::TEXT,
    Type::TEXT_ARRAY,
    Type::FLOAT8,
    Type::FLOAT8,
];
/// A COPY of 20,000 rows takes tens of milliseconds; this long means a dead peer whose TCP
/// connection never closed (host gone, network cut).
const COPY_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects with a bounded wait and drives the connection on its own task.
pub async fn connect(url: &str, application: &str) -> Result<Client, HistoryError> {
    let mut cfg = tokio_postgres::Config::from_str(url)?;
    cfg.connect_timeout(Duration::from_secs(5))
        .application_name(application);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(6), cfg.connect(NoTls))
        .await
        .map_err(|_| HistoryError::Timeout("connect timed out"))??;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %crate::error::pg_text(&e), "postgres connection ended");
        }
    });
    Ok(client)
}

/// The writer's connection, made on demand.
pub struct PgSink {
    url: String,
    client: Option<Client>,
}

impl PgSink {
    /// Does not connect yet: the first write (or [`PgSink::client`]) does.
    pub fn new(url: &str) -> Self {
        PgSink {
            url: url.to_string(),
            client: None,
        }
    }

    /// The live client, connecting when there is none.
    pub(crate) async fn client(&mut self) -> Result<&mut Client, HistoryError> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.client = Some(connect(&self.url, "courier-history-writer").await?);
        }
        Ok(self.client.as_mut().expect("set above"))
    }

    /// Forgets the client (after an error), so the next call reconnects.
    pub fn reset(&mut self) {
        self.client = None;
    }

    /// Writes `rows` in one transaction by binary COPY; all or nothing.
    pub async fn copy(&mut self, rows: &[Row]) -> Result<(), HistoryError> {
        let client = self.client().await?;
        let result = match tokio::time::timeout(COPY_TIMEOUT, copy_rows(client, rows)).await {
            Ok(r) => r,
            Err(_) => Err(HistoryError::Timeout("COPY timed out")),
        };
        if result.is_err() {
            self.reset();
        }
        result
    }
}

async fn copy_rows(client: &mut Client, rows: &[Row]) -> Result<(), HistoryError> {
    let tx = client.transaction().await?;
    let sink = tx.copy_in(COPY_SQL).await?;
    let writer = BinaryCopyInWriter::new(sink, &COLUMN_TYPES);
    tokio::pin!(writer);
    for r in rows {
        let id: &str = &r.courier_id;
        let orders: Option<Vec<&str>> = r.order_id.as_deref().map(crate::rows::running_orders);
        let first: Option<&str> = orders.as_ref().and_then(|o| o.first().copied());
        let values: [&(dyn ToSql + Sync); 8] = [
            &id,
            &r.seq,
            &system_time(r.phone_ts),
            &system_time(r.received_at),
            &first,
            &orders,
            &r.lat,
            &r.lon,
        ];
        writer.as_mut().write(&values).await?;
    }
    writer.finish().await?;
    tx.commit().await?;
    Ok(())
}
