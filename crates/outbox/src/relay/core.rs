//! The relay's lesson, three steps over one transaction:
//!
//! 1. [`claim`] — `BEGIN`, then lock the head rows of their orders with
//!    `FOR UPDATE SKIP LOCKED` (several relays share the work, none claims a
//!    row twice, and an order's later rows wait behind its head);
//! 2. [`deliver`] — hand the rows to the broker and wait for its answer to
//!    each;
//! 3. [`settle`] — mark what it acknowledged, note what it refused, `COMMIT`.
//!
//! Only the commit makes a row published. A crash anywhere before it rolls
//! the transaction back: the rows are pending again and go out again, with
//! the same event ids, and the consumers' inboxes absorb the copies.
//! Everything else in the relay (pipelining several batches, waking up,
//! backing off, metrics) is in `pipeline.rs` and `relay.rs`.

use sqlx::{Connection as _, PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::{PendingRow, PublishError, Publisher, Round};
use crate::Result;

/// The claim: the head row of each order (no earlier unpublished row of
/// its `message_key`), oldest first, locked, skipping rows another relay
/// holds.
///
/// The head rule is a scalar subquery per candidate — one probe of the
/// pending-by-key index — not `NOT EXISTS`: the planner turned that
/// anti-join into a hash join that read the whole index, dead entries
/// included, so a claim's cost grew with the rows ever published
/// (measured: docs/results/code-decisions.md).
const CLAIM: &str = "SELECT o.id, o.topic, o.message_key AS key, o.envelope::text AS body,
        o.event_id::text AS event_id, o.event_type, o.traceparent
 FROM outbox o
 WHERE o.published_at IS NULL AND o.parked_at IS NULL
   AND o.id = (
       SELECT p.id FROM outbox p
       WHERE p.message_key = o.message_key AND p.published_at IS NULL
       ORDER BY p.id LIMIT 1)
 ORDER BY o.id
 LIMIT $1
 FOR UPDATE SKIP LOCKED";

/// A claimed batch: the open transaction that holds its rows locked, and
/// the rows. Dropped unsettled, the transaction rolls back (sqlx sends the
/// `ROLLBACK` before the connection's next statement).
pub struct Claimed<'c> {
    tx: Transaction<'c, Postgres>,
    /// The batch's note in `outbox_inflight`.
    batch: Uuid,
    /// The rows, in id order.
    pub rows: Vec<PendingRow>,
}

/// Step 1: claims up to `limit` rows in a transaction on `conn`, or `None`
/// when no row is claimable.
///
/// The batch is also noted in `outbox_inflight` on `note`, another
/// connection — **outside** the transaction: a crash between the broker's
/// ack and the commit rolls the claim back but leaves the note, so the
/// relay that publishes those rows again can tell (and count,
/// `relay_republished_after_crash_total`) that it publishes them a second
/// time. The note skips the WAL flush wait (`synchronous_commit` off for
/// that statement): a database crash could at worst lose a count.
pub async fn claim<'c>(conn: &'c mut PgConnection, note: &mut PgConnection, limit: i64) -> Result<Option<Claimed<'c>>> {
    let mut tx = conn.begin().await?;
    let rows: Vec<PendingRow> = sqlx::query_as(CLAIM).bind(limit).fetch_all(&mut *tx).await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(None);
    }
    let batch = Uuid::new_v4();
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    sqlx::query(
        "WITH fast AS (SELECT set_config('synchronous_commit', 'off', true))
         INSERT INTO outbox_inflight (batch, ids) SELECT $1, $2 FROM fast",
    )
    .bind(batch)
    .bind(&ids)
    .execute(note)
    .await?;
    Ok(Some(Claimed { tx, batch, rows }))
}

/// Step 2: publishes the claimed rows; each row's result, in order, once
/// the broker acknowledged or refused it.
pub async fn deliver<P: Publisher>(publisher: &P, claimed: &Claimed<'_>) -> Vec<Result<(), PublishError>> {
    let results = publisher.publish(&claimed.rows).await;
    // The window this lesson is about: published, not yet marked.
    fail::fail_point!(super::CRASH_AFTER_PUBLISH_BEFORE_MARK, |_| crate::crash_point(
        super::CRASH_AFTER_PUBLISH_BEFORE_MARK
    ));
    results
}

/// Step 3: marks the acknowledged rows published, records the refused
/// ones (a row the broker can never take is parked: it leaves the pending
/// set with its error), and commits — which releases the locks.
pub async fn settle(mut claimed: Claimed<'_>, results: Vec<Result<(), PublishError>>) -> Result<Round> {
    let mut round = Round {
        claimed: claimed.rows.len(),
        ..Round::default()
    };
    let (mut published, mut refused) = (Vec::new(), Refused::default());
    for (row, result) in claimed.rows.iter().zip(results) {
        match result {
            Ok(()) => published.push(row.id),
            Err(e) => refused.push(row.id, e),
        }
    }
    // Marks what the broker took (keeping the first mark's time, which a
    // deadline's re-send does not reset: the audit holds it against the
    // log) and ends the batch's note — and the notes
    // of crashed relays' batches that held some of these rows: those rows
    // went out before, and are counted as published again.
    let republished: i64 = sqlx::query_scalar(
        "WITH marked AS (
             UPDATE outbox SET published_at = t.now, first_published_at = COALESCE(first_published_at, t.now),
                    attempts = attempts + 1
             FROM (SELECT clock_timestamp() AS now) t
             WHERE id = ANY($2::int8[])),
         gone AS (
             DELETE FROM outbox_inflight WHERE batch = $1 OR ids && $2::int8[] RETURNING batch, ids)
         SELECT count(*) FROM gone, unnest(gone.ids) AS id WHERE gone.batch <> $1 AND id = ANY($2::int8[])",
    )
    .bind(claimed.batch)
    .bind(&published)
    .fetch_one(&mut *claimed.tx)
    .await?;
    if !refused.ids.is_empty() {
        sqlx::query(
            "UPDATE outbox o SET attempts = o.attempts + 1, last_error = r.error,
                    parked_at = CASE WHEN r.park THEN now() ELSE o.parked_at END
             FROM unnest($1::int8[], $2::text[], $3::bool[]) AS r(id, error, park)
             WHERE o.id = r.id",
        )
        .bind(&refused.ids)
        .bind(&refused.errors)
        .bind(&refused.park)
        .execute(&mut *claimed.tx)
        .await?;
    }
    claimed.tx.commit().await?;
    round.published = published.len();
    round.republished = republished as usize;
    round.parked = refused.park.iter().filter(|p| **p).count();
    round.failed = refused.ids.len() - round.parked;
    Ok(round)
}

/// The rows the broker refused, as the columns of one `UPDATE … FROM unnest`.
#[derive(Default)]
struct Refused {
    ids: Vec<i64>,
    errors: Vec<String>,
    /// Refused for good (too large, malformed): parked.
    park: Vec<bool>,
}

impl Refused {
    fn push(&mut self, id: i64, e: PublishError) {
        if !e.retriable {
            tracing::error!(id, error = %e.message, "outbox row parked: the broker refuses it for good");
        }
        self.ids.push(id);
        self.park.push(!e.retriable);
        self.errors.push(e.message);
    }
}
