//! The inbox (idempotent consumer): layer 3 of the effectively-once design.
//!
//! A consumer opens the transaction of its effect with the inbox, applies
//! the effect in it, and commits once:
//!
//! ```no_run
//! # async fn handle(pool: &sqlx::PgPool, batch: &[inbox::Delivery]) -> sqlx::Result<()> {
//! let (mut tx, fresh) = inbox::begin_batch(pool, "inventory-service", batch).await?;
//! for i in fresh.indices() {
//!     // the effect of batch[i], written with `&mut *tx`
//! #   let _ = (i, &mut *tx);
//! }
//! tx.commit().await?; // the inbox rows and the effects, or neither
//! # Ok(())
//! # }
//! ```
//!
//! The insert either creates the `(consumer, event_id)` row — the event is new,
//! apply the effect and commit both — or hits the primary key and reports a
//! duplicate, and the effect is skipped. Because the decision is made by the
//! unique constraint inside the transaction, two instances handling the same
//! event at once cannot both apply it: the second insert waits for the first
//! transaction and then conflicts (or succeeds if the first rolled back).
//!
//! The consumer name is part of the key, so several consumers of one event
//! each deduplicate on their own (scenario 5). [`record`] and
//! [`record_batch`] do the same in a transaction the caller opened.

/// The crate's README, compiled and run as documentation tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::PgConnection;
use uuid::Uuid;

/// The broken inboxes the chaos suite swaps in (feature
/// `negative-controls`): each function below that one of them replaces
/// hands over to it in its first statement, compiled only with the feature.
#[cfg(feature = "negative-controls")]
pub mod negative_controls;

/// The inbox table's migrations (versions 1002xxxxxx).
pub fn migrator() -> Migrator {
    sqlx::migrate!("./migrations")
}

/// Whether an event was new for this consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// First time: apply the effect in the same transaction.
    New,
    /// Already processed by this consumer: skip the effect.
    Duplicate,
    /// The id was recorded for another fact (another type or digest,
    /// [`Fingerprint`]): not a copy but a reused id. Neither apply nor
    /// absorb it — refuse it (the consumers dead-letter it).
    Reused,
}

/// What fact a delivery states: its type and a digest of its content
/// (`contract::Envelope::fingerprint`), kept with the event's inbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// The event's type.
    pub event_type: String,
    /// The digest of its type, order and payload.
    pub digest: i64,
}

/// Records `event_id` as processed by `consumer` in the caller's transaction.
///
/// On a duplicate the redelivery is counted (in the same transaction: commit
/// it to keep the count, roll back to drop it) and the caller skips its effect.
pub async fn record(conn: &mut PgConnection, consumer: &str, event_id: Uuid) -> sqlx::Result<Recorded> {
    #[cfg(feature = "negative-controls")]
    if negative_controls::off() {
        return Ok(negative_controls::record());
    }
    let inserted = sqlx::query(
        "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT (consumer, event_id) DO NOTHING",
    )
    .bind(consumer)
    .bind(event_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(Recorded::New);
    }
    note_redelivery(conn, consumer, event_id).await?;
    Ok(Recorded::Duplicate)
}

/// One delivery of an event: its id, where in the log this copy was
/// read, if it came from one, and the fact it states, if known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The event's id (the same for every copy of the event).
    pub event_id: Uuid,
    /// Partition and offset of this copy (`None`: handed over by hand).
    pub source: Option<(i32, i64)>,
    /// Its type and digest (`None`: not checked against the row's).
    pub fingerprint: Option<Fingerprint>,
}

impl From<Uuid> for Delivery {
    fn from(event_id: Uuid) -> Self {
        Self {
            event_id,
            source: None,
            fingerprint: None,
        }
    }
}

/// Records a batch of deliveries for `consumer` in the caller's transaction
/// with one multi-row insert; returns, for each in order, whether its event
/// is new. An id that appears twice in the batch is new the first time
/// only. Duplicates are counted as in [`record`]. A new event's row keeps
/// the source of the copy being applied and its fingerprint; a repeat
/// whose fingerprint is not the row's is [`Recorded::Reused`], logged with
/// both types, and not counted as a redelivery.
pub async fn record_batch(
    conn: &mut PgConnection,
    consumer: &str,
    deliveries: &[Delivery],
) -> sqlx::Result<Vec<Recorded>> {
    #[cfg(feature = "negative-controls")]
    if negative_controls::off() {
        return Ok(negative_controls::record_batch(deliveries));
    }
    let ids: Vec<Uuid> = deliveries.iter().map(|d| d.event_id).collect();
    let partitions: Vec<Option<i32>> = deliveries.iter().map(|d| d.source.map(|s| s.0)).collect();
    let offsets: Vec<Option<i64>> = deliveries.iter().map(|d| d.source.map(|s| s.1)).collect();
    let types: Vec<Option<&str>> = deliveries
        .iter()
        .map(|d| d.fingerprint.as_ref().map(|f| f.event_type.as_str()))
        .collect();
    let digests: Vec<Option<i64>> = deliveries
        .iter()
        .map(|d| d.fingerprint.as_ref().map(|f| f.digest))
        .collect();
    // WITH ORDINALITY keeps the batch's order, so of two copies in one
    // batch the first is the one recorded. One round trip: the rows
    // inserted (new), and the rows that were there before the statement
    // (repeats), with the fingerprint each was recorded with — the
    // statement's snapshot does not see its own inserts. The repeats are
    // read by a join on the ids, not `event_id = ANY($2)`: on a table without
    // statistics the planner takes that for a filter and reads every row of
    // the consumer (20,000 rows for 32 ids, measured by
    // `cargo bench -p saga-kit --bench inbox_cost`); the join is an index
    // lookup per id whatever the statistics say.
    let rows: Vec<(Uuid, bool, Option<String>, Option<i64>)> = sqlx::query_as(
        "WITH ins AS (
             INSERT INTO inbox (consumer, event_id, source_partition, source_offset, event_type, digest)
             SELECT $1, id, p, o, ty, d
             FROM unnest($2::uuid[], $3::int4[], $4::int8[], $5::text[], $6::int8[]) WITH ORDINALITY AS t(id, p, o, ty, d, n)
             ORDER BY n
             ON CONFLICT (consumer, event_id) DO NOTHING RETURNING event_id)
         SELECT event_id, true, NULL::text, NULL::int8 FROM ins
         UNION ALL
         SELECT i.event_id, false, i.event_type, i.digest
         FROM unnest($2::uuid[]) AS t(id) JOIN inbox i ON i.consumer = $1 AND i.event_id = t.id
         WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.event_id = t.id)",
    )
    .bind(consumer)
    .bind(&ids)
    .bind(&partitions)
    .bind(&offsets)
    .bind(&types)
    .bind(&digests)
    .fetch_all(&mut *conn)
    .await?;
    let mut new = std::collections::HashSet::new();
    // The fact each id was recorded for: before this batch, or by its first copy in it.
    let mut facts = std::collections::HashMap::new();
    for (id, inserted, event_type, digest) in rows {
        if inserted {
            new.insert(id);
        } else if let (Some(event_type), Some(digest)) = (event_type, digest) {
            facts.insert(id, Fingerprint { event_type, digest });
        }
    }
    let mut recorded = Vec::with_capacity(ids.len());
    for d in deliveries {
        let id = d.event_id;
        if new.remove(&id) {
            if let Some(f) = &d.fingerprint {
                facts.insert(id, f.clone());
            }
            recorded.push(Recorded::New);
            continue;
        }
        match (facts.get(&id), &d.fingerprint) {
            (Some(was), Some(is)) if was != is => {
                tracing::error!(
                    consumer,
                    event_id = %id,
                    recorded_type = %was.event_type,
                    this_type = %is.event_type,
                    "an event id used again for another fact: refused, not absorbed"
                );
                recorded.push(Recorded::Reused);
            }
            _ => {
                note_redelivery(conn, consumer, id).await?;
                recorded.push(Recorded::Duplicate);
            }
        }
    }
    Ok(recorded)
}

/// Which deliveries of a batch are new to the consumer: apply their
/// effects in the transaction [`begin_batch`] returned; skip the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fresh(Vec<Recorded>);

impl Fresh {
    /// The indices of the new deliveries, in batch order.
    pub fn indices(&self) -> Vec<usize> {
        (0..self.0.len()).filter(|&i| self.0[i] == Recorded::New).collect()
    }

    /// Whether no delivery is new (the batch is all duplicates).
    pub fn is_empty(&self) -> bool {
        !self.0.contains(&Recorded::New)
    }

    /// The index of the first delivery whose id was recorded for another
    /// fact ([`Recorded::Reused`]), if any: refuse the batch.
    pub fn reused(&self) -> Option<usize> {
        self.0.iter().position(|r| *r == Recorded::Reused)
    }

    /// For each delivery in order, whether it was new.
    pub fn recorded(&self) -> &[Recorded] {
        &self.0
    }
}

/// Opens the transaction of a batch's effects and records its deliveries
/// for `consumer` in it ([`record_batch`]): the caller applies the effects
/// of [`Fresh::indices`] in the returned transaction and commits — the
/// inbox rows and the effects together, or neither.
pub async fn begin_batch(
    pool: &sqlx::PgPool,
    consumer: &str,
    deliveries: &[Delivery],
) -> sqlx::Result<(sqlx::Transaction<'static, sqlx::Postgres>, Fresh)> {
    #[cfg(feature = "negative-controls")]
    if negative_controls::apart() {
        return negative_controls::begin_batch(pool, consumer, deliveries).await;
    }
    let mut tx = pool.begin().await?;
    let recorded = record_batch(&mut tx, consumer, deliveries).await?;
    Ok((tx, Fresh(recorded)))
}

/// A reply an effect emitted for the event it applied, kept with that
/// event's inbox row so a repeat of the event can be answered again with
/// it, under the same id ([`record_replies`], [`replies_of`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Reply {
    /// The reply's own event id (the same on every copy).
    pub reply_id: Uuid,
    /// Where it was published.
    pub topic: String,
    /// Its message key.
    pub message_key: String,
    /// Its type.
    pub event_type: String,
    /// Its body, as published.
    pub body: String,
    /// Its trace context.
    pub traceparent: Option<String>,
}

/// Keeps, in the caller's transaction, the replies `consumer`'s effect
/// emitted: each `(event_id, reply)` under the event it answers, in the
/// order given. The event's inbox row must be in the same transaction (the
/// replies live and are purged with it): a reply without one is refused.
pub async fn record_replies(conn: &mut PgConnection, consumer: &str, replies: &[(Uuid, Reply)]) -> sqlx::Result<()> {
    if replies.is_empty() || !keeps_replies() {
        return Ok(());
    }
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("WITH {} SELECT count(*) FROM kept", record_replies_cte("kept", 1)));
    let kept: i64 = sqlx::Row::get(
        &bind_replies(sqlx::query(&SQL), consumer, replies)
            .fetch_one(conn)
            .await?,
        0,
    );
    replies_kept(consumer, replies.len(), kept)
}

/// Whether replies are kept: always, but with the inbox switched off (the
/// negative control), which keeps nothing.
pub fn keeps_replies() -> bool {
    #[cfg(feature = "negative-controls")]
    if negative_controls::off() {
        return false;
    }
    true
}

/// [`record_replies`] as a part of a larger statement: a common table
/// expression `name` that keeps the replies — parameters `$first` …
/// `$first + 7`, bound by [`bind_replies`] — and returns a row for each
/// one kept; check the count with [`replies_kept`]. A consumer writes its
/// outbox rows and their kept copies so, in one round trip.
///
/// Each reply joins its event's inbox row: one without it is not kept (a
/// reply for an event this consumer never recorded could only be a bug). A
/// join, not a foreign key: a key would share-lock the inbox row for every
/// reply (a WAL record each) and cascade the purge row by row.
pub fn record_replies_cte(name: &str, first: usize) -> String {
    let p: Vec<String> = (first..first + 8).map(|n| format!("${n}")).collect();
    format!(
        "{name} AS (
             INSERT INTO inbox_replies (consumer, event_id, seq, reply_id, topic, message_key, event_type, body, traceparent)
             SELECT {c}, e, n::int4, r, t, k, ty, b, tp
             FROM unnest({}::uuid[], {}::uuid[], {}::text[], {}::text[], {}::text[], {}::text[], {}::text[])
                  WITH ORDINALITY AS v(e, r, t, k, ty, b, tp, n)
             JOIN inbox i ON i.consumer = {c} AND i.event_id = v.e
             RETURNING 1)",
        p[1],
        p[2],
        p[3],
        p[4],
        p[5],
        p[6],
        p[7],
        c = p[0]
    )
}

/// Binds [`record_replies_cte`]'s parameters: the consumer and its replies.
pub fn bind_replies<'q>(
    statement: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    consumer: &'q str,
    replies: &[(Uuid, Reply)],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let col = |f: fn(&Reply) -> &str| replies.iter().map(|(_, r)| f(r).to_owned()).collect::<Vec<_>>();
    statement
        .bind(consumer)
        .bind(replies.iter().map(|(e, _)| *e).collect::<Vec<_>>())
        .bind(replies.iter().map(|(_, r)| r.reply_id).collect::<Vec<_>>())
        .bind(col(|r| &r.topic))
        .bind(col(|r| &r.message_key))
        .bind(col(|r| &r.event_type))
        .bind(col(|r| &r.body))
        .bind(replies.iter().map(|(_, r)| r.traceparent.clone()).collect::<Vec<_>>())
}

/// `Ok` when every one of `expected` replies was kept; an error naming how
/// many answer an event `consumer` has no inbox row for.
pub fn replies_kept(consumer: &str, expected: usize, kept: i64) -> sqlx::Result<()> {
    if kept == expected as i64 {
        return Ok(());
    }
    Err(sqlx::Error::InvalidArgument(format!(
        "{} of {expected} replies answer an event {consumer} has no inbox row for",
        expected as i64 - kept
    )))
}

/// The replies `consumer` kept for `event_ids`, in the order they were
/// emitted, each with the event it answers.
pub async fn replies_of(
    conn: &mut PgConnection,
    consumer: &str,
    event_ids: &[Uuid],
) -> sqlx::Result<Vec<(Uuid, Reply)>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        event_id: Uuid,
        #[sqlx(flatten)]
        reply: Reply,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT r.event_id, reply_id, topic, message_key, event_type, body, traceparent
         FROM unnest($2::uuid[]) AS t(id) JOIN inbox_replies r ON r.consumer = $1 AND r.event_id = t.id
         ORDER BY r.event_id, seq",
    )
    .bind(consumer)
    .bind(event_ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.event_id, r.reply)).collect())
}

/// Counts one absorbed redelivery of `event_id` to `consumer`.
pub async fn note_redelivery(conn: &mut PgConnection, consumer: &str, event_id: Uuid) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO inbox_redeliveries (consumer, event_id, redeliveries) VALUES ($1, $2, 1)
         ON CONFLICT (consumer, event_id)
         DO UPDATE SET redeliveries = inbox_redeliveries.redeliveries + 1, last_seen = now()",
    )
    .bind(consumer)
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records, in the caller's transaction, that `event_id` passed the inbox as
/// new although its effect was already applied for `order_id` — the
/// business key named by `caught_by` stopped it. Zero such rows is what the
/// inbox promises; the chaos suite counts them.
pub async fn note_miss(
    conn: &mut PgConnection,
    consumer: &str,
    event_id: Uuid,
    order_id: Uuid,
    caught_by: &str,
) -> sqlx::Result<()> {
    tracing::warn!(consumer, %event_id, %order_id, caught_by, "a repeated event passed the inbox; the business key caught it");
    sqlx::query("INSERT INTO inbox_misses (consumer, event_id, order_id, caught_by) VALUES ($1, $2, $3, $4)")
        .bind(consumer)
        .bind(event_id)
        .bind(order_id)
        .bind(caught_by)
        .execute(conn)
        .await?;
    Ok(())
}

/// Which of `event_ids` `consumer` already processed (a cheap pre-check for
/// handlers that must not even start their work twice; the authoritative
/// check is still [`record`] / [`record_batch`] in the effect's transaction).
pub async fn seen(
    conn: &mut PgConnection,
    consumer: &str,
    event_ids: &[Uuid],
) -> sqlx::Result<std::collections::HashSet<Uuid>> {
    #[cfg(feature = "negative-controls")]
    if negative_controls::off() {
        return Ok(Default::default());
    }
    // A join on the ids: an index lookup each (see `record_batch`).
    let seen = sqlx::query_scalar(
        "SELECT i.event_id FROM unnest($2::uuid[]) AS t(id) JOIN inbox i ON i.consumer = $1 AND i.event_id = t.id",
    )
    .bind(consumer)
    .bind(event_ids)
    .fetch_all(conn)
    .await?;
    Ok(seen.into_iter().collect())
}

/// Deletes up to `batch` inbox rows older than `retention`, and the
/// replies kept with them ([`record_replies`]); returns how many inbox rows.
///
/// `retention` must exceed the longest time the broker may redeliver an event
/// (offset retention plus the longest consumer outage tolerated): a redelivery
/// after its inbox row is gone would be applied again.
pub async fn purge(conn: &mut PgConnection, retention: Duration, batch: i64) -> sqlx::Result<u64> {
    let secs = retention.as_secs_f64();
    sqlx::query(
        "DELETE FROM inbox_redeliveries WHERE ctid IN (
             SELECT ctid FROM inbox_redeliveries WHERE last_seen < now() - make_interval(secs => $1) LIMIT $2)",
    )
    .bind(secs)
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    // The rows and their kept replies in one statement: the replies by one
    // join, not a cascade's statement per row.
    sqlx::query_scalar(
        "WITH gone AS (
             DELETE FROM inbox WHERE ctid IN (
                 SELECT ctid FROM inbox
                 WHERE processed_at < now() - make_interval(secs => $1)
                 LIMIT $2)
             RETURNING consumer, event_id),
         replies AS (
             DELETE FROM inbox_replies r USING gone
             WHERE r.consumer = gone.consumer AND r.event_id = gone.event_id)
         SELECT count(*) FROM gone",
    )
    .bind(secs)
    .bind(batch)
    .fetch_one(conn)
    .await
    .map(|gone: i64| gone as u64)
}

/// How long inbox rows are kept unless `INBOX_RETENTION_SECS` says
/// otherwise: a week, in seconds.
pub const DEFAULT_RETENTION_SECS: u64 = 7 * 86_400;

/// How long inbox rows are kept, as a typed setting for a service's config.
/// With the `clap` feature, a `clap::Args` to flatten into it.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct RetentionArgs {
    /// How long inbox rows are kept, in seconds (must exceed the broker's redelivery window).
    #[cfg_attr(feature = "clap", arg(long = "inbox-retention-secs", env = "INBOX_RETENTION_SECS", default_value_t = DEFAULT_RETENTION_SECS))]
    pub secs: u64,
    /// The longest consumer outage tolerated, in seconds: the inbox must
    /// outlast the topic's retention by this much.
    #[cfg_attr(
        feature = "clap",
        arg(
            long = "redelivery-margin-secs",
            env = "REDELIVERY_MARGIN_SECS",
            default_value_t = 86_400
        )
    )]
    pub margin_secs: u64,
}

impl RetentionArgs {
    /// The retention window.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.secs)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_window_is_the_retention_in_seconds() {
        let args = super::RetentionArgs {
            secs: 7 * 86_400,
            margin_secs: 86_400,
        };
        assert_eq!(args.window(), std::time::Duration::from_secs(604_800));
    }

    /// The default is the week docs/operations.md names (whether it
    /// outlasts the topics' retention is checked at start:
    /// `saga_kit::retention`).
    #[test]
    fn the_default_retention_is_a_week() {
        let (days, rest) = (
            super::DEFAULT_RETENTION_SECS / 86_400,
            super::DEFAULT_RETENTION_SECS % 86_400,
        );
        assert_eq!((days, rest), (7, 0));
    }
}
