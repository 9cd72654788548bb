//! The transactional outbox: layer 2 of the effectively-once design.
//!
//! A service never publishes from a request or message handler. It calls
//! [`enqueue`] with the transaction that carries its state change, so the
//! event exists if and only if the change committed. The [`relay`] later
//! publishes pending rows and deletes them in the transaction that settles
//! them (the table holds pending rows only; `outbox_published` records each
//! publication); a crash between publish and settle publishes the row
//! again, with the same `event_id`, and the consumers' inbox absorbs it.
//!
//! ```no_run
//! # async fn place(pool: &sqlx::PgPool, order_id: uuid::Uuid) -> Result<(), outbox::Error> {
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(order_id).execute(&mut *tx).await?;
//! let event = outbox::OutboxEvent::json("orders", order_id, uuid::Uuid::now_v7(), "OrderPlaced", &order_id);
//! outbox::enqueue(&mut tx, &event).await?; // the same transaction as the order
//! tx.commit().await?; // the order and its event, or neither
//! # Ok(())
//! # }
//! ```
//!
//! and, in a process of its own (or a task), the relay (feature `kafka`
//! for [`KafkaPublisher`]; any [`Publisher`] will do):
//!
//! ```no_run
//! # #[cfg(feature = "kafka")]
//! # async fn relay(pool: sqlx::PgPool) -> Result<(), rdkafka::error::KafkaError> {
//! let publisher = outbox::KafkaPublisher::new("localhost:9092")?;
//! let relay = outbox::Relay::new(pool, publisher, "orders-db");
//! relay.run(tokio_util::sync::CancellationToken::new()).await; // until cancelled
//! # Ok(())
//! # }
//! ```
//!
//! Its table comes with [`migrator`] (`outbox_*` migrations, versions
//! 1001xxxxxx); the relay's counters, gauges and histograms go through the
//! [`metrics`] facade to whatever recorder the application installs.

/// The crate's README, compiled and run as documentation tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(feature = "kafka")]
pub mod kafka;
/// The broken publishers the chaos suite swaps in (feature
/// `negative-controls`): the Kafka publisher hands a row's identity and its
/// producer's settings over to it, compiled only with the feature.
#[cfg(feature = "negative-controls")]
pub mod negative_controls;
pub mod relay;

use sqlx::migrate::Migrator;
use sqlx::{PgConnection, Postgres};
use uuid::Uuid;

#[cfg(feature = "kafka")]
pub use kafka::KafkaPublisher;
pub use relay::{PublishError, Publisher, Relay};

/// How long a relay keeps the records of publications
/// (`outbox_published`) unless `OUTBOX_RETENTION_SECS` says otherwise:
/// three days, in seconds.
pub const DEFAULT_RETENTION_SECS: u64 = 3 * 86_400;

/// Errors of the outbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The outbox table's migrations (versions 1001xxxxxx).
pub fn migrator() -> Migrator {
    sqlx::migrate!("./migrations")
}

/// Grants the relay's database role what a relay does with this database's
/// outbox, and nothing more: read, update (a refused row's error) and
/// delete `outbox` rows, record publications in `outbox_published`. The service that owns the tables calls it
/// after [`migrator`] ran, so a relay under its own role reads no other
/// table of the service (least privilege: the orders, the card tokens, the
/// idempotency keys stay the owner's). Already held, nothing is granted
/// again (concurrent `GRANT`s on one table can fail with "tuple concurrently
/// updated"); a role that does not exist is an error.
pub async fn grant_relay(pool: &sqlx::PgPool, role: &str) -> sqlx::Result<()> {
    let held: bool = sqlx::query_scalar(
        "SELECT has_table_privilege($1, 'outbox', 'SELECT, UPDATE, DELETE')
            AND has_table_privilege($1, 'outbox_published', 'SELECT, INSERT, UPDATE, DELETE')",
    )
    .bind(role)
    .fetch_one(pool)
    .await?;
    if held {
        return Ok(());
    }
    let role = format!("\"{}\"", role.replace('"', "\"\""));
    sqlx::raw_sql(&format!(
        "GRANT SELECT, UPDATE, DELETE ON outbox TO {role}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_published TO {role};"
    ))
    .execute(pool)
    .await?;
    Ok(())
}

/// One event as its service wrote it, ready for the outbox table. The
/// outbox does not care what the event means: the relay publishes `body`
/// byte for byte to `topic` under `key`, with `event_id`, `event_type` and
/// `traceparent` as Kafka headers.
#[derive(Debug, Clone)]
pub struct OutboxEvent<'a> {
    /// Destination topic.
    pub topic: &'a str,
    /// Kafka message key (per-key order is kept by the relay).
    pub key: String,
    /// Stable identity: every publish of this row carries it.
    pub event_id: Uuid,
    /// The event's type, for headers and dead-letter readers.
    pub event_type: &'a str,
    /// W3C trace context of the span that wrote the event.
    pub traceparent: Option<&'a str>,
    /// The message body, JSON.
    pub body: String,
}

impl<'a> OutboxEvent<'a> {
    /// An event with `body` serialised as JSON.
    pub fn json(
        topic: &'a str,
        key: impl ToString,
        event_id: Uuid,
        event_type: &'a str,
        body: &impl serde::Serialize,
    ) -> Self {
        Self {
            topic,
            key: key.to_string(),
            event_id,
            event_type,
            traceparent: None,
            body: serde_json::to_string(body).expect("event serialises"),
        }
    }

    /// With the trace context of the writing span.
    pub fn traceparent(mut self, traceparent: Option<&'a str>) -> Self {
        self.traceparent = traceparent;
        self
    }
}

/// Inserts `event` in the caller's transaction.
///
/// The `event_id` is the one every publish of this row will carry, however
/// often the relay retries: it is fixed here, at insert, never at publish.
pub async fn enqueue(conn: &mut PgConnection, event: &OutboxEvent<'_>) -> Result<()> {
    insert(conn, event, INSERT).await
}

/// Inserts `events` in the caller's transaction with one statement, their
/// ids (and so the relay's order per key) in the order given — what
/// [`enqueue`] does for each, for a batch of replies.
pub async fn enqueue_all(conn: &mut PgConnection, events: &[OutboxEvent<'_>]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("WITH {} SELECT 1", enqueue_all_cte("c", 1)));
    bind_all(sqlx::query(&SQL), events).execute(conn).await?;
    Ok(())
}

const INSERT: &str = "INSERT INTO outbox (event_id, topic, message_key, envelope, event_type, traceparent)
                      VALUES ($1, $2, $3, $4::json, $5, $6)";
const INSERT_AGAIN: &str = "INSERT INTO outbox (event_id, topic, message_key, envelope, event_type, traceparent)
                            VALUES ($1, $2, $3, $4::json, $5, $6)
                            ON CONFLICT (event_id) DO UPDATE
                            SET parked_at = NULL, attempts = 0, last_error = NULL";

/// Enqueues `event` again under the same event id: publishes it once more,
/// whether its row is still here (pending, or parked: it becomes pending
/// again) or was published and so left the table (it is inserted again;
/// its record in `outbox_published` keeps the first publication's time). A reader whose inbox has the
/// event absorbs the copy; one that never got it (the first copy was
/// dead-lettered, say) handles it. For a deadline's re-send, never for a new
/// fact.
pub async fn enqueue_again(conn: &mut PgConnection, event: &OutboxEvent<'_>) -> Result<()> {
    insert(conn, event, INSERT_AGAIN).await
}

async fn insert(conn: &mut PgConnection, event: &OutboxEvent<'_>, sql: &'static str) -> Result<()> {
    bind(sqlx::query(sql), event).execute(conn).await?;
    Ok(())
}

/// [`enqueue`] as a part of a larger statement: a common table expression
/// `name` that inserts one event — its parameters `$first` … `$first + 5`,
/// bound by [`bind`] — once for each row of `from` (none when `from` has
/// none). A service whose whole request is one statement
/// (`idempotency::at_once`) writes its outbox row so, in the same
/// round trip as its state.
pub fn enqueue_cte(name: &str, from: &str, first: usize) -> String {
    let p: Vec<String> = (first..first + 6).map(|n| format!("${n}")).collect();
    format!(
        "{name} AS (INSERT INTO outbox (event_id, topic, message_key, envelope, event_type, traceparent) \
         SELECT {}, {}, {}, {}::json, {}, {} FROM {from})",
        p[0], p[1], p[2], p[3], p[4], p[5]
    )
}

/// [`enqueue_all`] as a part of a larger statement: a common table
/// expression `name` that inserts `events` — six arrays, parameters
/// `$first` … `$first + 5`, bound by [`bind_all`] — their ids in the order
/// given (none for empty arrays). A consumer writes its batch's state and
/// its outbox rows so, in one round trip.
pub fn enqueue_all_cte(name: &str, first: usize) -> String {
    let p: Vec<String> = (first..first + 6).map(|n| format!("${n}")).collect();
    format!(
        "{name} AS (INSERT INTO outbox (event_id, topic, message_key, envelope, event_type, traceparent) \
         SELECT e, t, k, b::json, ty, tp \
         FROM unnest({}::uuid[], {}::text[], {}::text[], {}::text[], {}::text[], {}::text[]) \
              WITH ORDINALITY AS r(e, t, k, b, ty, tp, n) \
         ORDER BY n)",
        p[0], p[1], p[2], p[3], p[4], p[5]
    )
}

/// Binds `events` as [`enqueue_all_cte`]'s six arrays (borrowed, not copied).
pub fn bind_all<'q>(
    statement: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    events: &'q [OutboxEvent<'_>],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let column = |f: fn(&'q OutboxEvent<'_>) -> &'q str| events.iter().map(f).collect::<Vec<&'q str>>();
    statement
        .bind(events.iter().map(|e| e.event_id).collect::<Vec<Uuid>>())
        .bind(column(|e| e.topic))
        .bind(column(|e| &e.key))
        .bind(column(|e| &e.body))
        .bind(column(|e| e.event_type))
        .bind(events.iter().map(|e| e.traceparent).collect::<Vec<Option<&'q str>>>())
}

/// Binds `event`'s six values, in [`enqueue_cte`]'s order.
pub fn bind<'q>(
    statement: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    event: &'q OutboxEvent<'_>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    statement
        .bind(event.event_id)
        .bind(event.topic)
        .bind(&event.key)
        .bind(&event.body)
        .bind(event.event_type)
        .bind(event.traceparent)
}

/// The counters the relay records through the [`metrics`] facade (name,
/// help), each labelled with the relay's `source`. Whatever recorder the
/// application installs receives them; [`describe_metrics`] gives it their help.
pub const COUNTERS: &[(&str, &str)] = &[
    (
        "relay_published_total",
        "Outbox rows published and settled (deleted, their publication recorded).",
    ),
    (
        "relay_publish_errors_total",
        "Publish attempts that failed (row stays pending).",
    ),
    (
        "relay_parked_total",
        "Rows the broker refused for good (parked, not retried).",
    ),
    (
        "relay_resent_total",
        "Rows published under an event id published before (a deadline's re-send).",
    ),
];

/// The relay's gauges (name, help), labelled with its `source`.
pub const GAUGES: &[(&str, &str)] = &[
    ("relay_pending_rows", "Outbox rows not yet published."),
    (
        "outbox_oldest_pending_seconds",
        "Age of the oldest unpublished outbox row.",
    ),
];

/// The relay's histograms in seconds (name, help), labelled with its `source`.
pub const HISTOGRAMS: &[(&str, &str)] = &[(
    "relay_publish_duration_seconds",
    "From sending a claimed batch to the broker's last ack.",
)];

/// Registers the help of [`COUNTERS`], [`GAUGES`] and [`HISTOGRAMS`] with the
/// installed `metrics` recorder (call after installing it).
pub fn describe_metrics() {
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
    for (name, help) in GAUGES {
        metrics::describe_gauge!(*name, *help);
    }
    for (name, help) in HISTOGRAMS {
        metrics::describe_histogram!(*name, metrics::Unit::Seconds, *help);
    }
}

/// Aborts the process at crash point `point` (failpoints builds), after
/// saying so on stderr in the words a test harness looks for
/// (`crash point fired: <point>`). No destructor or flush runs: a crash.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn crash_point(point: &str) -> ! {
    eprintln!("crash point fired: {point}");
    std::process::abort()
}
