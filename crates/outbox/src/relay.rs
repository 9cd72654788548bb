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

use std::future::Future;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureProducer;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::Result;

/// A claimed row on its way to the broker.
#[derive(Debug, Clone)]
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
    /// The envelope as stored (JSON), published as is: the relay never
    /// re-serialises, so a republish carries the same document.
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

/// The production publisher: rdkafka's idempotent producer.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
}

impl KafkaPublisher {
    /// A publisher for `brokers`.
    pub fn new(brokers: &str) -> messaging::Result<Self> {
        Ok(Self {
            producer: messaging::kafka::producer(brokers)?,
        })
    }

    /// A publisher whose messages fail after `timeout` without a broker ack
    /// (the row then stays pending and is retried).
    pub fn with_timeout(brokers: &str, timeout: Duration) -> messaging::Result<Self> {
        Ok(Self {
            producer: messaging::kafka::producer_with_timeout(brokers, timeout)?,
        })
    }
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        let sends = rows.iter().map(|row| {
            let headers = messaging::kafka::headers_for(&row.event_id, &row.event_type, row.traceparent.as_deref());
            messaging::kafka::publish_raw(&self.producer, &row.topic, &row.key, row.body.as_bytes(), headers)
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .map(|r| {
                r.map_err(|e| {
                    let retriable = !matches!(
                        &e,
                        messaging::Error::Kafka(KafkaError::MessageProduction(
                            RDKafkaErrorCode::MessageSizeTooLarge
                                | RDKafkaErrorCode::InvalidMessageSize
                                | RDKafkaErrorCode::InvalidMessage
                        ))
                    );
                    PublishError {
                        retriable,
                        message: e.to_string(),
                    }
                })
            })
            .collect()
    }
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
    poll_interval: Duration,
}

impl<P: Publisher> Relay<P> {
    /// A relay for `pool` named `source` (used in metrics and logs).
    ///
    /// Each concurrent [`Relay::run_once`] holds two connections of `pool`
    /// (the claiming transaction and the batch bookkeeping beside it), and
    /// [`Relay::run`] one more for `LISTEN`: size the pool for that.
    pub fn new(pool: PgPool, publisher: P, source: impl Into<String>) -> Self {
        Self {
            pool,
            publisher,
            source: source.into(),
            batch: 256,
            poll_interval: Duration::from_millis(500),
        }
    }

    /// Sets the claim batch size.
    pub fn batch(mut self, batch: i64) -> Self {
        self.batch = batch;
        self
    }

    /// Sets the fallback polling interval (used when a notification is missed).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Claims, publishes and marks one batch.
    pub async fn run_once(&self) -> Result<Round> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(
            "SELECT o.id, o.topic, o.message_key, o.envelope::text AS body,
                    o.envelope->>'event_id' AS event_id, o.envelope->>'event_type' AS event_type,
                    o.envelope->>'traceparent' AS traceparent
             FROM outbox o
             WHERE o.published_at IS NULL AND o.parked_at IS NULL
               AND NOT EXISTS (
                   SELECT 1 FROM outbox p
                   WHERE p.message_key = o.message_key AND p.published_at IS NULL AND p.id < o.id)
             ORDER BY o.id
             LIMIT $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(self.batch)
        .fetch_all(&mut *tx)
        .await?;
        let mut round = Round {
            claimed: rows.len(),
            ..Round::default()
        };
        if rows.is_empty() {
            return Ok(round);
        }
        let mut pending = Vec::with_capacity(rows.len());
        let mut parked: Vec<(i64, String)> = Vec::new();
        for row in rows {
            let id: i64 = row.get("id");
            match (
                row.get::<Option<String>, _>("event_id"),
                row.get::<Option<String>, _>("event_type"),
            ) {
                (Some(event_id), Some(event_type)) => pending.push(PendingRow {
                    id,
                    topic: row.get("topic"),
                    key: row.get("message_key"),
                    event_id,
                    event_type,
                    traceparent: row.get("traceparent"),
                    body: row.get("body"),
                }),
                _ => parked.push((id, "stored envelope has no event_id or event_type".into())),
            }
        }
        // Note the batch before asking the broker, outside the claim
        // transaction, so a crash between publish and mark leaves a trace.
        let batch = uuid::Uuid::new_v4();
        let ids: Vec<i64> = pending.iter().map(|r| r.id).collect();
        // Bookkeeping for a metric only: skip the WAL flush wait (a database
        // crash could at worst lose a count), keeping it off the latency path.
        sqlx::query(
            "WITH fast AS (SELECT set_config('synchronous_commit', 'off', true))
             INSERT INTO outbox_inflight (batch, ids) SELECT $1, $2 FROM fast",
        )
        .bind(batch)
        .bind(&ids)
        .execute(&self.pool)
        .await?;
        let results = self.publisher.publish(&pending).await;
        fail::fail_point!("relay::after_publish_before_mark", |_| std::process::abort());
        let mut published = Vec::new();
        let mut failed: Vec<(i64, String)> = Vec::new();
        for (row, result) in pending.iter().zip(results) {
            match result {
                Ok(()) => published.push(row.id),
                Err(e) if e.retriable => failed.push((row.id, e.message)),
                Err(e) => parked.push((row.id, e.message)),
            }
        }
        sqlx::query("UPDATE outbox SET published_at = clock_timestamp(), attempts = attempts + 1 WHERE id = ANY($1)")
            .bind(&published)
            .execute(&mut *tx)
            .await?;
        // The batch is done; batches of crashed relays that published some of
        // these rows before are done too, and their overlap was republished.
        let republished: i64 = sqlx::query_scalar(
            "WITH gone AS (
                 DELETE FROM outbox_inflight WHERE batch = $1 OR ids && $2::int8[] RETURNING batch, ids)
             SELECT count(*) FROM gone, unnest(gone.ids) AS id WHERE gone.batch <> $1 AND id = ANY($2::int8[])",
        )
        .bind(batch)
        .bind(&published)
        .fetch_one(&mut *tx)
        .await?;
        round.republished = republished as usize;
        for (id, error) in &failed {
            sqlx::query("UPDATE outbox SET attempts = attempts + 1, last_error = $2 WHERE id = $1")
                .bind(id)
                .bind(error)
                .execute(&mut *tx)
                .await?;
        }
        for (id, error) in &parked {
            tracing::error!(source = %self.source, id, %error, "outbox row parked");
            sqlx::query("UPDATE outbox SET attempts = attempts + 1, last_error = $2, parked_at = now() WHERE id = $1")
                .bind(id)
                .bind(error)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        round.published = published.len();
        round.failed = failed.len();
        round.parked = parked.len();
        let src = [("source", self.source.as_str())];
        telemetry::metrics::incr_by("relay_published_total", &src, round.published as i64);
        telemetry::metrics::incr_by("relay_publish_errors_total", &src, round.failed as i64);
        telemetry::metrics::incr_by("relay_parked_total", &src, round.parked as i64);
        telemetry::metrics::incr_by("relay_republished_after_crash_total", &src, round.republished as i64);
        if round.republished > 0 {
            tracing::warn!(source = %self.source, rows = round.republished, "republished rows a crashed relay had published but not marked");
        }
        Ok(round)
    }

    /// Relays until `shutdown`: publishes while rows are pending, then sleeps
    /// until a `NOTIFY outbox_new` or the poll interval; backs off on errors.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut listener = self.listen().await;
        let mut backoff = Duration::from_millis(100);
        while !shutdown.is_cancelled() {
            let wait = match self.run_once().await {
                Ok(r) if r.claimed > 0 && r.failed == 0 => {
                    backoff = Duration::from_millis(100);
                    continue;
                }
                Ok(r) if r.failed == 0 => None,
                Ok(r) => {
                    tracing::warn!(source = %self.source, failed = r.failed, ?backoff, "publish failed, backing off");
                    Some(backoff)
                }
                Err(e) => {
                    tracing::warn!(source = %self.source, error = %e, ?backoff, "relay round failed, backing off");
                    listener = None;
                    Some(backoff)
                }
            };
            if let Some(delay) = wait {
                backoff = (backoff * 2).min(Duration::from_secs(5));
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
                continue;
            }
            if listener.is_none() {
                listener = self.listen().await;
            }
            let poll = self.poll_interval;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(poll) => {}
                n = async { match listener.as_mut() { Some(l) => l.recv().await.map(|_| ()), None => std::future::pending().await } } => {
                    if n.is_err() { listener = None; }
                }
            }
        }
    }

    async fn listen(&self) -> Option<PgListener> {
        let mut l = PgListener::connect_with(&self.pool).await.ok()?;
        l.listen("outbox_new").await.ok()?;
        Some(l)
    }

    /// Refreshes the backlog gauges: pending rows and oldest pending age.
    pub async fn observe_backlog(&self) -> Result<(i64, f64)> {
        let (pending, age): (i64, f64) = sqlx::query_as(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
             FROM outbox WHERE published_at IS NULL AND parked_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        let src = [("source", self.source.as_str())];
        telemetry::metrics::set("relay_pending_rows", &src, pending);
        telemetry::metrics::set("relay_oldest_pending_ms", &src, (age * 1000.0) as i64);
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
