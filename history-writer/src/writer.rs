//! The writer task: takes batches from the buffer (full, or once the oldest row has waited
//! `batch_max_age`), writes each by COPY, and decides what a failure means:
//! - connection or server trouble: the batch goes back to the front of the buffer, and the
//!   next attempt waits (backoff with jitter, doubling up to `retry_max_backoff`);
//! - a day without a partition: the partition is created and the batch written again; if that
//!   cannot be done, the rows are dropped and counted (`no_partition`) with the days named;
//! - PostgreSQL refusing the data itself (SQLSTATE classes 22, 23): the batch is halved until
//!   the refused row is alone, so only that row is dropped (`rejected`), never its good
//!   neighbours;
//! - PostgreSQL refusing every write for a reason of its own (read-only after a failover,
//!   permissions, a missing table): the batch is kept, the connection renewed, and the writer
//!   backs off, logging an error: no row is dropped for a database that is read-only a minute.
//!
//! On shutdown it writes what is buffered until `flush_deadline`, then counts the rest as
//! dropped (`shutdown`).

use crate::config::HistoryConfig;
use crate::events::{CopyError, DropReason, Metrics, Stats};
use crate::partitions;
use crate::rows::Row;
use crate::sink::PgSink;
use crate::Shared;
use courier_wire::clock::unix_now;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The writer's outcome for one batch.
enum Written {
    Done,
    /// The database is unreachable or failing: wait before the next attempt.
    BackOff,
}

struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(max: Duration) -> Self {
        let first = Duration::from_millis(100).min(max);
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next attempt: half fixed, half random (jitter keeps several writers
    /// from hammering a recovering server in step).
    fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d / 2 + d.mul_f64(rand::random::<f64>() / 2.0)
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}

pub(crate) struct Writer {
    pub shared: Arc<Shared>,
    pub sink: PgSink,
    pub config: HistoryConfig,
    pub metrics: Arc<Metrics>,
    pub stats: Arc<Stats>,
}

impl Writer {
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let max_age = self.config.batch_max_age.as_secs_f64();
        let mut backoff = Backoff::new(self.config.retry_max_backoff);
        while !shutdown.is_cancelled() {
            let (len, oldest) = self.shared.peek();
            self.metrics.depth(&self.stats, len);
            let wait = match oldest {
                None => max_age,
                Some(t) if len < self.config.batch_max => max_age - (unix_now() - t),
                Some(_) => 0.0,
            };
            if wait > 0.0 {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = self.shared.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs_f64(wait)) => {}
                }
                continue;
            }
            let batch = self.shared.take(self.config.batch_max);
            match self.write(batch).await {
                Written::Done => backoff.reset(),
                Written::BackOff => {
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(backoff.step()) => {}
                    }
                }
            }
        }
        self.flush(backoff).await;
    }

    /// Writes what is buffered until the deadline; counts what is left.
    async fn flush(&mut self, mut backoff: Backoff) {
        let deadline = Instant::now() + self.config.flush_deadline;
        let pending = self.shared.peek().0;
        if pending > 0 {
            tracing::info!(rows = pending, deadline = ?self.config.flush_deadline, "history: flushing the buffer");
        }
        loop {
            let batch = self.shared.take(self.config.batch_max);
            if batch.is_empty() {
                break;
            }
            let n = batch.len() as u64;
            match tokio::time::timeout_at(deadline.into(), self.write(batch)).await {
                Ok(Written::Done) => backoff.reset(),
                Ok(Written::BackOff) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(backoff.step().min(left)).await;
                }
                Err(_) => {
                    // Cut off mid-write: it may or may not have committed; counted as dropped.
                    self.metrics.dropped(&self.stats, DropReason::Shutdown, n);
                    break;
                }
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        let left = self.shared.take(usize::MAX).len() as u64;
        if left > 0 {
            tracing::error!(
                rows = left,
                "history: flush deadline passed; rows not written"
            );
            self.metrics
                .dropped(&self.stats, DropReason::Shutdown, left);
        }
        self.metrics.depth(&self.stats, 0);
    }

    /// Writes one batch, splitting it when PostgreSQL refuses a row.
    async fn write(&mut self, batch: Vec<Row>) -> Written {
        let mut chunks: VecDeque<Vec<Row>> = VecDeque::from([batch]);
        let mut partition_attempts = 0;
        while let Some(chunk) = chunks.pop_front() {
            let t0 = Instant::now();
            match self.sink.copy(&chunk).await {
                Ok(()) => {
                    let now = unix_now();
                    self.metrics.copy_seconds.record(t0.elapsed().as_secs_f64());
                    self.stats.copy_micros.fetch_add(
                        t0.elapsed().as_micros() as u64,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    self.metrics.batch_size.record(chunk.len() as f64);
                    let lags: Vec<f64> = chunk
                        .iter()
                        .map(|r| (now - r.received_at).max(0.0))
                        .collect();
                    self.metrics.written(&self.stats, chunk.len() as u64, &lags);
                }
                Err(e) if e.is_no_partition() => {
                    self.stats
                        .copy_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut days: Vec<i64> = chunk
                        .iter()
                        .map(|r| partitions::day_of(r.received_at))
                        .collect();
                    days.sort_unstable();
                    days.dedup();
                    let names: Vec<String> = days.iter().map(|d| partitions::name(*d)).collect();
                    partition_attempts += 1;
                    if partition_attempts > 2 {
                        tracing::error!(rows = chunk.len(), days = ?names, "history: rows have no partition even after creating it; dropped");
                        self.metrics.dropped(
                            &self.stats,
                            DropReason::NoPartition,
                            chunk.len() as u64,
                        );
                        continue;
                    }
                    let created = match self.sink.client().await {
                        Ok(c) => partitions::ensure_days(c, &days).await,
                        Err(e) => Err(e),
                    };
                    match created {
                        Ok(created) => {
                            tracing::warn!(days = ?names, created = ?created, "history: a batch had days without a partition; created them");
                            self.metrics.partitions(&self.stats, created.len(), 0);
                            chunks.push_front(chunk);
                        }
                        Err(e) if e.is_retryable() => {
                            self.sink.reset();
                            tracing::warn!(error = %e, days = ?names, "history: cannot create partitions yet; will retry");
                            self.requeue(chunk, chunks);
                            return Written::BackOff;
                        }
                        Err(e) => {
                            self.sink.reset();
                            tracing::error!(error = %e, rows = chunk.len(), days = ?names, "history: cannot create the partitions; rows dropped");
                            self.metrics.dropped(
                                &self.stats,
                                DropReason::NoPartition,
                                chunk.len() as u64,
                            );
                        }
                    }
                }
                Err(e) if e.is_retryable() => {
                    self.stats.pg_up.set(false);
                    self.stats
                        .copy_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.metrics.copy_error(CopyError::Retryable);
                    tracing::warn!(error = %e, rows = chunk.len(), "history: COPY failed; rows back in the buffer, retrying");
                    self.requeue(chunk, chunks);
                    return Written::BackOff;
                }
                Err(e) if !e.is_row_fault() => {
                    // The database refuses every row alike (read-only, permissions, schema):
                    // keep the batch, reconnect (a failover's new primary is another session)
                    // and back off; an operator is alerted by the error log and the counter.
                    self.stats.pg_up.set(false);
                    self.stats
                        .copy_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.metrics.copy_error(CopyError::Database);
                    tracing::error!(error = %e, rows = chunk.len(), "history: PostgreSQL refuses every write (not a row's fault); rows kept in the buffer, retrying");
                    self.sink.reset();
                    self.requeue(chunk, chunks);
                    return Written::BackOff;
                }
                Err(e) => {
                    self.stats
                        .copy_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.metrics.copy_error(CopyError::Data);
                    if chunk.len() == 1 {
                        tracing::error!(error = %e, courier = %chunk[0].courier_id, seq = chunk[0].seq, "history: PostgreSQL refused a row; dropped");
                        self.metrics.dropped(&self.stats, DropReason::Rejected, 1);
                    } else {
                        tracing::warn!(error = %e, rows = chunk.len(), "history: PostgreSQL refused the batch; splitting it to find the row");
                        let mut first = chunk;
                        let second = first.split_off(first.len() / 2);
                        chunks.push_front(second);
                        chunks.push_front(first);
                    }
                }
            }
        }
        Written::Done
    }

    /// Puts the unwritten chunks back at the front of the buffer, in order.
    fn requeue(&self, chunk: Vec<Row>, rest: VecDeque<Vec<Row>>) {
        let mut all = chunk;
        for c in rest {
            all.extend(c);
        }
        let dropped = self.shared.requeue(all);
        self.metrics
            .dropped(&self.stats, DropReason::BufferFull, dropped);
    }
}
