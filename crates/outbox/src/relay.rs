//! The relay: claim → deliver → settle, per source database.
//!
//! - `relay/core.rs` is the lesson: [`claim`] locks the head rows of their
//!   orders in a transaction (`FOR UPDATE SKIP LOCKED`, so several relays
//!   share the work and an order's rows go out in insert order),
//!   [`deliver`] hands them to the broker, [`settle`] deletes what it
//!   acknowledged (recording the publication in `outbox_published`) and
//!   commits: the table holds pending rows only. A crash before the commit
//!   publishes the rows again, with the same event ids. [`Relay::run_once`] is those three
//!   calls.
//! - `relay/pipeline.rs` is the machinery: [`Relay::run`] keeps several
//!   batches at the broker at once, probes for rows when idle (every
//!   `poll_interval`, one index-only query — not `LISTEN/NOTIFY` from an
//!   insert trigger, whose notification-queue lock cost more database CPU
//!   per order than the saga's own transactions; measured:
//!   docs/results/code-decisions.md), and backs off on failures.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::Result;

mod conns;
mod core;
mod pipeline;
pub use self::core::{claim, deliver, settle, Claimed};
use conns::Spare;

/// Crash point (failpoints builds): abort after the broker acknowledged a
/// batch, before the rows are marked published — they are published again,
/// with the same event ids, and the consumers' inboxes absorb the copies.
pub const CRASH_AFTER_PUBLISH_BEFORE_MARK: &str = "relay::after_publish_before_mark";

/// A claimed row on its way to the broker.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRow {
    /// Outbox row id.
    pub id: i64,
    /// Destination topic.
    pub topic: String,
    /// Message key (the order id).
    pub key: String,
    /// The envelope's event id.
    pub event_id: String,
    /// The envelope's event type.
    pub event_type: String,
    /// The envelope's trace context.
    pub traceparent: Option<String>,
    /// The envelope as its service serialised it (JSON), published as is:
    /// the relay never re-serialises, so a republish carries the same bytes.
    pub body: String,
}

/// Why publishing one row failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct PublishError {
    /// The broker may accept the row later (it stays pending); otherwise it is parked.
    pub retriable: bool,
    /// What went wrong.
    pub message: String,
}

/// Publishes a batch of rows; the result for each row, in order.
pub trait Publisher: Send + Sync {
    /// Publishes `rows` and resolves once the broker acknowledged (or refused) each.
    fn publish(&self, rows: &[PendingRow]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send;
}

/// Outcome of one claim/publish/mark round.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows marked published.
    pub published: usize,
    /// Rows left pending after a retriable error.
    pub failed: usize,
    /// Rows parked after a permanent error.
    pub parked: usize,
    /// Rows whose event id had been published before (a deadline's
    /// re-send). A row published again after a relay crashed before its
    /// settle is not counted here — nothing recorded its first copy — but
    /// where it lands: the consumers' `consumer_duplicates_absorbed_total`.
    pub resent: usize,
}

/// Relays one source database's outbox.
pub struct Relay<P> {
    pool: PgPool,
    publisher: P,
    source: String,
    batch: i64,
    in_flight: usize,
    poll_interval: Duration,
    /// Connections between two uses (see [`Spare`]).
    spare: Spare,
}

/// What a batch's claim found (the pipeline claims the next batch once it knows).
enum ClaimOutcome {
    /// Rows were claimed: the batch is at the broker.
    Rows,
    /// Nothing claimable.
    Empty,
    /// The claim failed (the database; the batch returns the error).
    Failed,
}

impl<P: Publisher> Relay<P> {
    /// A relay for `pool` named `source` (used in metrics and logs).
    ///
    /// Each claimed batch holds a connection of `pool` (its transaction)
    /// until it is settled; [`Relay::run`] keeps up to `in_flight` batches
    /// and one more connection for the idle probe: size the pool for
    /// `in_flight + 1`. Between uses the relay keeps up to two of them out
    /// of the pool (`relay/conns.rs`: handing a connection back costs
    /// sqlx's ping).
    pub fn new(pool: PgPool, publisher: P, source: impl Into<String>) -> Self {
        Self {
            spare: Spare::new(pool.clone(), 2),
            pool,
            publisher,
            source: source.into(),
            batch: 1024,
            in_flight: 2,
            poll_interval: Duration::from_millis(500),
        }
    }

    /// Sets the claim batch size.
    pub fn batch(mut self, batch: i64) -> Self {
        self.batch = batch;
        self
    }

    /// Sets how long an idle relay waits before it looks for pending rows again.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets how many claimed batches may await the broker at once (see [`Relay::run`]).
    pub fn in_flight(mut self, batches: usize) -> Self {
        self.in_flight = batches.max(1);
        self
    }

    /// The relay as the textbook draws it: one batch at a time — [`claim`],
    /// [`deliver`], [`settle`] on one connection, in one transaction — and
    /// a pause of the poll interval when nothing is pending or a step
    /// failed (the rows stay pending; the next round takes them). [`Self::run`]
    /// is the same three steps with several batches at the broker at once.
    pub async fn run_simple(&self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            let round = async {
                let mut conn = self.pool.acquire().await?;
                let Some(batch) = claim(&mut conn, self.batch).await? else {
                    return Ok::<_, crate::Error>(None);
                };
                let results = deliver(&self.publisher, &batch).await;
                settle(batch, results).await.map(Some)
            };
            match round.await {
                Ok(Some(round)) if round.failed == 0 => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, source = %self.source, "relay round failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.poll_interval) => {}
                () = shutdown.cancelled() => {}
            }
        }
    }

    /// Claims, publishes and settles one batch: the lesson of `core.rs`
    /// in three calls.
    pub async fn run_once(&self) -> Result<Round> {
        let round = self.one_batch(|_| {}).await;
        self.spare.release();
        round
    }

    /// One batch on connections the relay keeps between uses: [`claim`]
    /// (telling `claimed` what it found), [`deliver`], [`settle`]; timed and
    /// counted.
    async fn one_batch(&self, claimed: impl FnOnce(ClaimOutcome)) -> Result<Round> {
        let mut conn = match self.spare.take().await {
            Ok(conn) => conn,
            Err(e) => {
                claimed(ClaimOutcome::Failed);
                return Err(e.into());
            }
        };
        let batch = match claim(&mut conn, self.batch).await {
            Ok(Some(batch)) => batch,
            other => {
                // Nothing claimed: no transaction is left open on `conn`.
                if let Some(e) = other.err() {
                    claimed(ClaimOutcome::Failed);
                    return Err(e);
                }
                claimed(ClaimOutcome::Empty);
                self.spare.keep(conn);
                return Ok(Round::default());
            }
        };
        claimed(ClaimOutcome::Rows);
        let sent = Instant::now();
        let results = deliver(&self.publisher, &batch).await;
        metrics::histogram!("relay_publish_duration_seconds", "source" => self.source.clone())
            .record(sent.elapsed().as_secs_f64());
        let round = settle(batch, results).await?;
        self.spare.keep(conn);
        for (name, rows) in [
            ("relay_published_total", round.published),
            ("relay_publish_errors_total", round.failed),
            ("relay_parked_total", round.parked),
            ("relay_resent_total", round.resent),
        ] {
            metrics::counter!(name, "source" => self.source.clone()).increment(rows as u64);
        }
        Ok(round)
    }

    /// Refreshes the backlog gauges: pending rows and oldest pending age.
    pub async fn observe_backlog(&self) -> Result<(i64, f64)> {
        let (pending, age): (i64, f64) = sqlx::query_as(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
             FROM outbox WHERE parked_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        metrics::gauge!("relay_pending_rows", "source" => self.source.clone()).set(pending as f64);
        metrics::gauge!("outbox_oldest_pending_seconds", "source" => self.source.clone()).set(age);
        Ok((pending, age))
    }

    /// Deletes up to `batch` records of publications (`outbox_published`)
    /// older than `retention`.
    pub async fn purge_published(&self, retention: Duration, batch: i64) -> Result<u64> {
        Ok(sqlx::query(
            "DELETE FROM outbox_published WHERE ctid = ANY(ARRAY(
                 SELECT ctid FROM outbox_published
                 WHERE published_at < now() - make_interval(secs => $1)
                 LIMIT $2))",
        )
        .bind(retention.as_secs_f64())
        .bind(batch)
        .execute(&self.pool)
        .await?
        .rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::pipeline::{back_off, MAX_BACKOFF, MIN_BACKOFF};
    use std::time::Instant;

    #[test]
    fn a_pause_lasts_its_backoff_which_doubles_up_to_the_cap() {
        let mut backoff = MIN_BACKOFF;
        let before = Instant::now();
        let until = back_off(&mut backoff);
        assert!(until >= before + MIN_BACKOFF, "the pause ends after its backoff");
        assert_eq!(backoff, MIN_BACKOFF * 2);
        for _ in 0..10 {
            back_off(&mut backoff);
        }
        assert_eq!(backoff, MAX_BACKOFF);
    }
}
