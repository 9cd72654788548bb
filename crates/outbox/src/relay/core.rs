//! The relay's lesson, three steps over one transaction:
//!
//! 1. [`claim`] — `BEGIN`, then lock the head rows of their orders with
//!    `FOR UPDATE SKIP LOCKED` (several relays share the work, none claims a
//!    row twice, and an order's later rows wait behind its head);
//! 2. [`deliver`] — hand the rows to the broker and wait for its answer to
//!    each;
//! 3. [`settle`] — delete what it acknowledged (recording the publication
//!    in `outbox_published`), note what it refused, `COMMIT`.
//!
//! Only the commit makes a row published: the table holds pending rows
//! only. A crash anywhere before it rolls the transaction back: the rows
//! are pending again and go out again, with the same event ids, and the
//! consumers' inboxes absorb the copies.
//! Everything else in the relay (pipelining several batches, waking up,
//! backing off, metrics) is in `pipeline.rs` and `relay.rs`.

use sqlx::{Connection as _, PgConnection, Postgres, Transaction};

use super::{PendingRow, PublishError, Publisher, Round};
use crate::Result;

/// The claim: the head row of each order (no earlier row of its
/// `message_key` in the table — every row here is unpublished, a parked
/// one included), oldest first, locked, skipping rows another relay holds.
///
/// The head rule is a scalar subquery per candidate — one probe of the
/// pending-by-key index — not `NOT EXISTS`: the planner turned that
/// anti-join into a hash join that read the whole index, dead entries
/// included, so a claim's cost grew with the rows ever published
/// (measured: docs/results/code-decisions.md).
const CLAIM: &str = "SELECT o.id, o.topic, o.message_key AS key, o.envelope::text AS body,
        o.event_id::text AS event_id, o.event_type, o.traceparent
 FROM outbox o
 WHERE o.parked_at IS NULL
   AND o.id = (
       SELECT p.id FROM outbox p
       WHERE p.message_key = o.message_key
       ORDER BY p.id LIMIT 1)
 ORDER BY o.id
 LIMIT $1
 FOR UPDATE SKIP LOCKED";

/// A claimed batch: the open transaction that holds its rows locked, and
/// the rows. Dropped unsettled, the transaction rolls back (sqlx sends the
/// `ROLLBACK` before the connection's next statement).
pub struct Claimed<'c> {
    tx: Transaction<'c, Postgres>,
    /// The rows, in id order.
    pub rows: Vec<PendingRow>,
}

/// Step 1: claims up to `limit` rows in a transaction on `conn`, or `None`
/// when no row is claimable.
pub async fn claim(conn: &mut PgConnection, limit: i64) -> Result<Option<Claimed<'_>>> {
    let mut tx = conn.begin().await?;
    let rows: Vec<PendingRow> = sqlx::query_as(CLAIM).bind(limit).fetch_all(&mut *tx).await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(None);
    }
    Ok(Some(Claimed { tx, rows }))
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

/// Step 3: deletes the acknowledged rows, recording each publication in
/// `outbox_published`; records the refused ones (a row the broker can
/// never take is parked: it leaves the pending set with its error); and
/// commits — which releases the locks.
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
    // One statement: the rows leave the outbox and their publication is
    // recorded. A row published before under the same event id (a
    // deadline's re-send) keeps its first time, which the audit holds
    // against the log, and counts as sent again.
    let again: i64 = sqlx::query_scalar(
        "WITH gone AS (
             DELETE FROM outbox WHERE id = ANY($1::int8[])
             RETURNING event_id, topic, message_key, event_type, traceparent, created_at, attempts),
         recorded AS (
             INSERT INTO outbox_published AS p
                 (event_id, topic, message_key, event_type, traceparent, created_at,
                  first_published_at, published_at, attempts)
             SELECT event_id, topic, message_key, event_type, traceparent, created_at,
                    t.at, t.at, attempts + 1
             FROM gone, (SELECT clock_timestamp() AS at) t
             ON CONFLICT (event_id) DO UPDATE
                 SET published_at = excluded.published_at, attempts = p.attempts + excluded.attempts
             RETURNING xmax <> 0 AS again)
         SELECT count(*) FILTER (WHERE again) FROM recorded",
    )
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
    round.resent = again as usize;
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
