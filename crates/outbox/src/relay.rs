//! The relay engine: claim → publish → mark, per source database.
//!
//! **Claiming.** Rows are claimed inside a transaction with
//! `FOR UPDATE SKIP LOCKED`, so several relays share the work without claiming
//! a row twice. **Ordering.** A row is claimable only when no earlier
//! unpublished row of the same `message_key` (order) exists. A relay holding
//! an order's head row locked therefore keeps every other relay off that
//! order's later rows until the head is marked; at most one row per order is
//! in flight at a time, so an order's events reach Kafka in insert order.
//! **Marking.** Rows are marked published only after the broker's delivery
//! report, in the claiming transaction; a crash before the commit releases
//! the locks and the rows are published again (same event ids).
//! **Pipelining.** [`Relay::run`] keeps up to `in_flight` claimed batches at
//! the broker and claims the next meanwhile; the head rule applies to a
//! relay's own in-flight rows as to another relay's, so order still holds.
//! **Waking.** A busy relay claims again as soon as a batch settles; an idle
//! one probes for pending rows every `poll_interval` (5 ms in outbox-relay)
//! with one index-only query, not on `LISTEN/NOTIFY` from an insert
//! trigger: every notifying commit takes PostgreSQL's notification-queue
//! lock and signals the listeners, which under load cost more database CPU
//! per order than the saga's own transactions, for a wake-up the probe gives
//! as well (measured: docs/results/code-decisions.md).

use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::Result;

mod conns;
use conns::{Claim, Spare};

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
    /// Rows published again because an earlier relay crashed before marking them.
    pub republished: usize,
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

/// What finished in the relay's pipeline.
enum Step {
    Claimed(Result<Option<Box<Claim>>>),
    Delivered(Result<Round>),
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The end of a pause of `backoff`, which doubles for the next one.
fn back_off(backoff: &mut Duration) -> Instant {
    let until = Instant::now() + *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    until
}

/// Sleeps until `deadline` (forever without one).
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

impl<P: Publisher> Relay<P> {
    /// A relay for `pool` named `source` (used in metrics and logs).
    ///
    /// Each claimed batch holds a connection of `pool` (its transaction)
    /// until it is settled, and a claim briefly needs a second one (the batch
    /// bookkeeping beside it); [`Relay::run`] keeps up to `in_flight` batches
    /// and one more connection for the idle probe: size the pool for
    /// `in_flight + 2`. Between uses the relay keeps up to two of them out
    /// of the pool: the next claim's and the bookkeeping's.
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

    /// Sets the fallback poll interval (when no notification arrives).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets how many claimed batches may await the broker at once (see [`Relay::run`]).
    pub fn in_flight(mut self, batches: usize) -> Self {
        self.in_flight = batches.max(1);
        self
    }

    /// Claims, publishes and marks one batch.
    pub async fn run_once(&self) -> Result<Round> {
        let round = match self.claim().await {
            Ok(Some(claim)) => self.deliver(claim).await,
            Ok(None) => Ok(Round::default()),
            Err(e) => Err(e),
        };
        self.spare.release();
        round
    }

    /// Claims the next batch, or `None` when no row is claimable. The rows
    /// stay locked by the returned transaction until [`Relay::settle`].
    ///
    /// The head rule is a scalar subquery per candidate — one probe of the
    /// pending-by-key index, the head of the key — not `NOT EXISTS`: the
    /// planner turned that anti-join into a hash join whose bitmap scan read
    /// the whole pending-by-key index, dead entries of every row published
    /// since the last vacuum included (a bitmap scan never marks them dead),
    /// so a claim cost grew with the rows published (measured:
    /// docs/results/code-decisions.md).
    async fn claim(&self) -> Result<Option<Claim>> {
        let mut claim = Claim::begin(&self.spare).await?;
        claim.pending = sqlx::query_as(
            "SELECT o.id, o.topic, o.message_key AS key, o.envelope::text AS body,
                    o.event_id::text AS event_id, o.event_type, o.traceparent
             FROM outbox o
             WHERE o.published_at IS NULL AND o.parked_at IS NULL
               AND o.id = (
                   SELECT p.id FROM outbox p
                   WHERE p.message_key = o.message_key AND p.published_at IS NULL
                   ORDER BY p.id LIMIT 1)
             ORDER BY o.id
             LIMIT $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(self.batch)
        .fetch_all(claim.conn())
        .await?;
        if claim.pending.is_empty() {
            claim.end(&self.spare, "ROLLBACK").await?;
            return Ok(None);
        }
        // Note the batch before asking the broker, outside the claim
        // transaction, so a crash between publish and mark leaves a trace.
        let ids: Vec<i64> = claim.pending.iter().map(|r| r.id).collect();
        // Bookkeeping for a metric only: skip the WAL flush wait (a database
        // crash could at worst lose a count), keeping it off the latency path.
        let mut conn = self.spare.take().await?;
        sqlx::query(
            "WITH fast AS (SELECT set_config('synchronous_commit', 'off', true))
             INSERT INTO outbox_inflight (batch, ids) SELECT $1, $2 FROM fast",
        )
        .bind(claim.batch)
        .bind(&ids)
        .execute(&mut *conn)
        .await?;
        self.spare.keep(conn);
        Ok(Some(claim))
    }

    /// Publishes a claimed batch and settles it.
    async fn deliver(&self, claim: Claim) -> Result<Round> {
        let sent = Instant::now();
        let results = self.publisher.publish(&claim.pending).await;
        metrics::histogram!("relay_publish_duration_seconds", "source" => self.source.clone())
            .record(sent.elapsed().as_secs_f64());
        fail::fail_point!(CRASH_AFTER_PUBLISH_BEFORE_MARK, |_| crate::crash_point(
            CRASH_AFTER_PUBLISH_BEFORE_MARK
        ));
        self.settle(claim, results).await
    }

    /// Marks what the broker acknowledged, notes what it refused, and
    /// commits, releasing the batch's locks.
    async fn settle(&self, mut claim: Claim, results: Vec<Result<(), PublishError>>) -> Result<Round> {
        let (batch, pending) = (claim.batch, std::mem::take(&mut claim.pending));
        let mut round = Round {
            claimed: pending.len(),
            ..Round::default()
        };
        let (mut published, mut failed, mut parked) = (Vec::new(), Vec::new(), Vec::new());
        for (row, result) in pending.iter().zip(results) {
            match result {
                Ok(()) => published.push(row.id),
                Err(e) if e.retriable => failed.push((row.id, e.message)),
                Err(e) => parked.push((row.id, e.message)),
            }
        }
        // One statement marks what the broker took and ends the batch's
        // bookkeeping: the batch is done, and so are batches of crashed
        // relays that published some of these rows before — their overlap
        // was republished, and is counted.
        let republished: i64 = sqlx::query_scalar(
            "WITH marked AS (
                 UPDATE outbox SET published_at = clock_timestamp(), attempts = attempts + 1
                 WHERE id = ANY($2::int8[])),
             gone AS (
                 DELETE FROM outbox_inflight WHERE batch = $1 OR ids && $2::int8[] RETURNING batch, ids)
             SELECT count(*) FROM gone, unnest(gone.ids) AS id WHERE gone.batch <> $1 AND id = ANY($2::int8[])",
        )
        .bind(batch)
        .bind(&published)
        .fetch_one(claim.conn())
        .await?;
        round.republished = republished as usize;
        for (id, error) in &parked {
            tracing::error!(source = %self.source, id, %error, "outbox row parked");
        }
        // One statement for every refused row (a broker outage refuses the
        // whole batch): the attempt and its error; parked rows also leave
        // the pending set.
        let (mut ids, mut errors, mut park) = (Vec::new(), Vec::new(), Vec::new());
        for ((id, error), parks) in failed
            .iter()
            .map(|r| (r, false))
            .chain(parked.iter().map(|r| (r, true)))
        {
            ids.push(*id);
            errors.push(error.as_str());
            park.push(parks);
        }
        if !ids.is_empty() {
            sqlx::query(
                "UPDATE outbox o SET attempts = o.attempts + 1, last_error = r.error,
                        parked_at = CASE WHEN r.park THEN now() ELSE o.parked_at END
                 FROM unnest($1::int8[], $2::text[], $3::bool[]) AS r(id, error, park)
                 WHERE o.id = r.id",
            )
            .bind(&ids)
            .bind(&errors)
            .bind(&park)
            .execute(claim.conn())
            .await?;
        }
        claim.end(&self.spare, "COMMIT").await?;
        round.published = published.len();
        round.failed = failed.len();
        round.parked = parked.len();
        for (name, rows) in [
            ("relay_published_total", round.published),
            ("relay_publish_errors_total", round.failed),
            ("relay_parked_total", round.parked),
            ("relay_republished_after_crash_total", round.republished),
        ] {
            metrics::counter!(name, "source" => self.source.clone()).increment(rows as u64);
        }
        if round.republished > 0 {
            tracing::warn!(source = %self.source, rows = round.republished, "republished rows a crashed relay had published but not marked");
        }
        Ok(round)
    }

    /// Relays until `shutdown`, as a pipeline: up to `in_flight` claimed
    /// batches await the broker while the next one is claimed, so the
    /// database work of one batch overlaps the broker round trip of the
    /// others. Per-order order still holds: an in-flight batch keeps its
    /// rows pending and locked, so the head rule keeps every later row of
    /// those orders out of the next claims.
    ///
    /// When nothing is claimable the relay probes for pending rows every
    /// poll interval. A failed claim or a batch the broker did not take
    /// pauses claiming with exponential backoff (the rows stay pending).
    /// On `shutdown` it stops claiming and settles the batches in flight.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut backoff = MIN_BACKOFF;
        let mut steps: FuturesUnordered<BoxFuture<'_, Step>> = FuturesUnordered::new();
        let (mut claiming, mut delivering) = (false, 0usize);
        // Whether a claim may find rows: false after an empty claim, until a
        // batch settles (its orders' next rows become claimable) or a probe
        // finds a pending row.
        let mut claimable = true;
        let mut paused_until: Option<Instant> = None;
        loop {
            let stopping = shutdown.is_cancelled();
            if stopping && steps.is_empty() {
                self.spare.release();
                return;
            }
            let paused = paused_until.is_some_and(|t| Instant::now() < t);
            if !stopping && !claiming && claimable && !paused && delivering < self.in_flight {
                claiming = true;
                steps.push(async { Step::Claimed(self.claim().await.map(|c| c.map(Box::new))) }.boxed());
            }
            tokio::select! {
                Some(step) = steps.next(), if !steps.is_empty() => match step {
                    Step::Claimed(Ok(Some(claim))) => {
                        (claiming, delivering) = (false, delivering + 1);
                        steps.push(async { Step::Delivered(self.deliver(*claim).await) }.boxed());
                    }
                    Step::Claimed(Ok(None)) => (claiming, claimable) = (false, false),
                    Step::Claimed(Err(e)) => {
                        claiming = false;
                        tracing::warn!(source = %self.source, error = %e, ?backoff, "claim failed, backing off");
                        paused_until = Some(back_off(&mut backoff));
                    }
                    Step::Delivered(result) => {
                        (delivering, claimable) = (delivering - 1, true);
                        match result {
                            Ok(r) if r.failed == 0 => backoff = MIN_BACKOFF,
                            Ok(r) => {
                                tracing::warn!(source = %self.source, failed = r.failed, ?backoff, "publish failed, backing off");
                                paused_until = Some(back_off(&mut backoff));
                            }
                            Err(e) => {
                                tracing::warn!(source = %self.source, error = %e, ?backoff, "settling a batch failed, backing off");
                                paused_until = Some(back_off(&mut backoff));
                            }
                        }
                    }
                },
                _ = shutdown.cancelled(), if !stopping => {}
                _ = sleep_until(paused_until), if paused => paused_until = None,
                _ = self.wait_for_rows(), if !claimable && !paused && !stopping => claimable = true,
            }
        }
    }

    /// Returns once a pending row exists: probes every poll interval with
    /// one cheap query (the partial index of pending rows), so an idle relay
    /// costs a few hundred index lookups a minute and wakes within one interval.
    async fn wait_for_rows(&self) {
        loop {
            tokio::time::sleep(self.poll_interval).await;
            let pending = async {
                let mut conn = self.spare.take().await?;
                let pending: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL AND parked_at IS NULL)",
                )
                .fetch_one(&mut *conn)
                .await?;
                self.spare.keep(conn);
                Ok::<_, sqlx::Error>(pending)
            }
            .await;
            // A failed probe: let the claim find out (and back off).
            if pending.unwrap_or(true) {
                return;
            }
        }
    }

    /// Refreshes the backlog gauges: pending rows and oldest pending age.
    pub async fn observe_backlog(&self) -> Result<(i64, f64)> {
        let (pending, age): (i64, f64) = sqlx::query_as(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
             FROM outbox WHERE published_at IS NULL AND parked_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        metrics::gauge!("relay_pending_rows", "source" => self.source.clone()).set(pending as f64);
        metrics::gauge!("outbox_oldest_pending_seconds", "source" => self.source.clone()).set(age);
        Ok((pending, age))
    }

    /// Deletes up to `batch` published rows older than `retention`.
    pub async fn purge_published(&self, retention: Duration, batch: i64) -> Result<u64> {
        Ok(sqlx::query(
            "DELETE FROM outbox WHERE id IN (
                 SELECT id FROM outbox
                 WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1)
                 LIMIT $2)",
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
    use super::*;

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
