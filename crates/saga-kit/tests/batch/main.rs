//! The batch-inbox loop and the emit glue against a real PostgreSQL: the
//! inbox rows and the effect commit together or not at all, duplicates
//! (seen before or repeated inside the batch) are skipped, and an emitted
//! message is an outbox row in the caller's transaction.

use contract::{Envelope, Message};
use kafka::consumer::{HandleError, Handled, Position, Traced};
use saga_kit::consumer::{begin, commit, handle_one};
use sqlx::{PgConnection, PgPool};
use testkit::TempDb;
use uuid::Uuid;

mod consumer;
mod journey;

const EFFECTS: &str = "CREATE TABLE effects (event_id uuid NOT NULL, position integer NOT NULL, \
                       at bigserial PRIMARY KEY)";

async fn world() -> (TempDb, PgPool) {
    TempDb::with_tables("eo_sagakit", vec![outbox::migrator(), inbox::migrator()], EFFECTS)
        .await
        .unwrap()
}

fn reserve(order_id: Uuid) -> Envelope {
    let message = Message::ReserveStock {
        sku: "SKU-1".into(),
        quantity: 1,
    };
    Envelope::new(order_id, &message, None)
}

/// `envelope` as the consume loop hands it over, read at `offset` of partition 0.
fn at(envelope: &Envelope, offset: i64) -> Traced<Envelope> {
    Traced {
        message: envelope.clone(),
        span: tracing::Span::none(),
        position: Some(Position { partition: 0, offset }),
        producer: None,
        header_event_id: None,
    }
}

async fn effect(conn: &mut PgConnection, envelope: &Envelope, index: usize) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (event_id, position) VALUES ($1, $2)")
        .bind(envelope.event_id)
        .bind(index as i32)
        .execute(conn)
        .await
        .map(drop)
}

async fn effects(pool: &PgPool) -> Vec<(Uuid, i32)> {
    sqlx::query_as("SELECT event_id, position FROM effects ORDER BY at")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A handler as the services write one: begin (the inbox rows), the
/// effect of each fresh envelope, commit. `fail_on` makes that envelope's
/// effect fail.
async fn batch(pool: &PgPool, items: &[Traced<Envelope>], fail_on: Option<Uuid>) -> Result<Vec<Handled>, HandleError> {
    let (mut tx, fresh) = begin(pool, "c", items).await?;
    for i in fresh.indices() {
        let envelope = &items[i].message;
        if fail_on == Some(envelope.event_id) {
            return Err(HandleError::transient("the effect failed"));
        }
        effect(&mut tx, envelope, i).await.map_err(HandleError::transient)?;
    }
    commit(tx, &fresh).await
}

#[tokio::test]
async fn a_batch_applies_each_new_event_once_in_order_and_skips_the_rest() {
    let (_db, pool) = world().await;
    let order = Uuid::new_v4();
    let (a, b, c) = (reserve(order), reserve(order), reserve(order));
    let handled = batch(&pool, &[at(&a, 1), at(&b, 2), at(&a, 3)], None).await.unwrap();
    assert_eq!(handled, [Handled::Applied, Handled::Applied, Handled::Duplicate]);
    assert_eq!(effects(&pool).await, [(a.event_id, 0), (b.event_id, 1)]);
    // The next batch: b again (a redelivery), then c.
    let handled = batch(&pool, &[at(&b, 2), at(&c, 4)], None).await.unwrap();
    assert_eq!(handled, [Handled::Duplicate, Handled::Applied]);
    assert_eq!(
        effects(&pool).await,
        [(a.event_id, 0), (b.event_id, 1), (c.event_id, 1)]
    );
    // The inbox names the copy applied: a's first (offset 1, not 3).
    let a_source: (Option<i32>, Option<i64>) =
        sqlx::query_as("SELECT source_partition, source_offset FROM inbox WHERE event_id = $1")
            .bind(a.event_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(a_source, (Some(0), Some(1)));
    pool.close().await;
}

#[tokio::test]
async fn a_failed_effect_rolls_back_the_batchs_inbox_rows_and_its_effects() {
    let (_db, pool) = world().await;
    let order = Uuid::new_v4();
    let (a, b) = (reserve(order), reserve(order));
    let items = [at(&a, 1), at(&b, 2)];
    let e = batch(&pool, &items, Some(b.event_id)).await.unwrap_err();
    assert!(matches!(e, HandleError::Transient(_)), "{e:?}");
    assert_eq!(count(&pool, "inbox").await, 0, "no event recorded as processed");
    assert_eq!(count(&pool, "effects").await, 0, "a's effect went with the transaction");
    // The redelivery applies both.
    let handled = batch(&pool, &items, None).await.unwrap();
    assert_eq!(handled, [Handled::Applied, Handled::Applied]);
    assert_eq!(count(&pool, "inbox").await, 2);
    pool.close().await;
}

#[tokio::test]
async fn fresh_names_the_new_deliveries_and_a_batch_of_duplicates_has_none() {
    let (_db, pool) = world().await;
    let order = Uuid::new_v4();
    let (a, b) = (reserve(order), reserve(order));
    let (tx, fresh) = begin(&pool, "c", &[at(&a, 1), at(&a, 2), at(&b, 3)]).await.unwrap();
    assert_eq!((fresh.indices(), fresh.is_empty()), (vec![0, 2], false));
    assert_eq!(
        commit(tx, &fresh).await.unwrap(),
        [Handled::Applied, Handled::Duplicate, Handled::Applied]
    );
    let (tx, fresh) = begin(&pool, "c", &[at(&b, 3), at(&a, 1)]).await.unwrap();
    assert_eq!((fresh.indices(), fresh.is_empty()), (vec![], true));
    assert_eq!(
        commit(tx, &fresh).await.unwrap(),
        [Handled::Duplicate, Handled::Duplicate]
    );
    // Dropped without a commit, the inbox rows go with the transaction.
    let c = reserve(order);
    let (tx, fresh) = begin(&pool, "c", &[at(&c, 4)]).await.unwrap();
    assert!(!fresh.is_empty());
    drop(tx);
    let (tx, fresh) = begin(&pool, "c", &[at(&c, 4)]).await.unwrap();
    assert_eq!(fresh.indices(), [0], "not recorded by the dropped transaction");
    tx.rollback().await.unwrap();
    pool.close().await;
}

#[tokio::test]
async fn handle_one_is_a_batch_of_one() {
    let (_db, pool) = world().await;
    let a = reserve(Uuid::new_v4());
    let one = |env: Envelope| {
        let pool = pool.clone();
        handle_one(env, move |items| async move { batch(&pool, &items, None).await })
    };
    assert_eq!(one(a.clone()).await.unwrap(), Handled::Applied);
    assert_eq!(one(a.clone()).await.unwrap(), Handled::Duplicate);
    let source: (Option<i32>, Option<i64>) =
        sqlx::query_as("SELECT source_partition, source_offset FROM inbox WHERE event_id = $1")
            .bind(a.event_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(source, (None, None), "no position: not read from the log");
    pool.close().await;
}

/// One outbox row as the relay will read it.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    event_id: Uuid,
    topic: String,
    message_key: String,
    event_type: String,
    envelope: serde_json::Value,
}

async fn outbox_rows(pool: &PgPool) -> Vec<Row> {
    sqlx::query_as("SELECT event_id, topic, message_key, event_type, envelope FROM outbox ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn emitting_enqueues_the_envelope_on_its_topic_keyed_by_order_in_the_callers_transaction() {
    let (_db, pool) = world().await;
    let order = Uuid::new_v4();
    let cause = reserve(order);
    let mut tx = pool.begin().await.unwrap();
    let sent = saga_kit::emit::emit(&mut tx, order, &Message::StockReserved, Some(&cause))
        .await
        .unwrap();
    let minted = Uuid::now_v7();
    let as_minted = saga_kit::emit::emit_as(&mut tx, order, &Message::ReleaseStock, None, minted)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(outbox_rows(&pool).await.is_empty(), "rolled back with the caller");

    let mut tx = pool.begin().await.unwrap();
    let sent_again = saga_kit::emit::emit(&mut tx, order, &Message::StockReserved, Some(&cause))
        .await
        .unwrap();
    saga_kit::emit::emit_as(&mut tx, order, &Message::ReleaseStock, None, minted)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_ne!(sent.event_id, sent_again.event_id, "a new id per emit");
    assert_eq!(as_minted.event_id, minted);
    assert_eq!(sent_again.causation_id, Some(cause.event_id));
    assert_eq!(sent_again.correlation_id, cause.correlation_id);
    let rows = outbox_rows(&pool).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].event_id, sent_again.event_id);
    assert_eq!(rows[0].topic, contract::topics::ORDER_EVENTS);
    assert_eq!(rows[0].message_key, order.to_string());
    assert_eq!(rows[0].event_type, sent_again.event_type);
    assert_eq!(rows[0].envelope, serde_json::to_value(&sent_again).unwrap());
    assert_eq!(
        (rows[1].event_id, rows[1].topic.as_str()),
        (minted, contract::topics::INVENTORY_COMMANDS)
    );

    // Both published (the relay deletes a row it settles); a re-send under
    // the first id puts that one back, under the same id.
    sqlx::query("DELETE FROM outbox") // published: the relay settles a row by deleting it
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let again = saga_kit::emit::emit_again(&mut conn, order, &Message::ReleaseStock, minted)
        .await
        .unwrap();
    assert_eq!(again.event_id, minted);
    let pending: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(pending, [minted]);

    // A batch's replies: one statement, in the order given.
    let span = tracing::Span::none();
    let replies: Vec<(Message, Envelope)> = [Message::StockReleased, Message::StockReserved]
        .into_iter()
        .map(|m| {
            let envelope = saga_kit::emit::envelope(order, &m, Some(&cause), &span);
            (m, envelope)
        })
        .collect();
    assert_eq!(replies[0].1.causation_id, Some(cause.event_id));
    saga_kit::emit::emit_all(&mut conn, &replies).await.unwrap();
    let rows = outbox_rows(&pool).await;
    let tail: Vec<Uuid> = rows[1..].iter().map(|r| r.event_id).collect();
    assert_eq!(tail, [replies[0].1.event_id, replies[1].1.event_id]);
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn a_participant_database_is_created_with_the_outbox_and_the_inbox() {
    let db = TempDb::new("eo_sagakit_connect");
    let pool = saga_kit::participant::connect(db.url(), 2, vec![]).await.unwrap();
    for table in ["outbox", "inbox", "inbox_redeliveries"] {
        assert_eq!(count(&pool, table).await, 0, "{table} exists");
    }
    pool.close().await;
}

/// The service error a handler wraps a database error in.
#[derive(Debug, thiserror::Error)]
#[error("the effect failed")]
struct Effect(#[source] sqlx::Error);

#[tokio::test]
async fn a_handler_error_is_classified_by_the_database_error_behind_it() {
    use saga_kit::consumer::classify;
    let (_db, pool) = world().await;
    // 23505 unique violation, behind a service's own error: permanent.
    sqlx::raw_sql("CREATE TABLE once (id int PRIMARY KEY); INSERT INTO once VALUES (1)")
        .execute(&pool)
        .await
        .unwrap();
    let unique = sqlx::query("INSERT INTO once VALUES (1)")
        .execute(&pool)
        .await
        .unwrap_err();
    // The whole chain is kept, as the cause: the service's error, then sqlx's.
    let permanent = classify(Effect(unique));
    assert!(matches!(permanent, HandleError::Permanent(_)), "{permanent:?}");
    let report = permanent.report();
    assert!(
        report.starts_with("permanent: the effect failed: ") && report.contains("once"),
        "{report}"
    );
    let source = std::error::Error::source(&permanent).expect("the cause is the source");
    assert!(
        source.source().is_some(),
        "and the cause keeps its own source: {report}"
    );
    // 22P02 invalid text for an integer: permanent.
    let data = sqlx::query("SELECT 'x'::int").execute(&pool).await.unwrap_err();
    assert!(matches!(classify(data), HandleError::Permanent(_)));
    // The server shutting down or refusing connections, out of resources, a
    // connection exception: the database is down — unavailable.
    for code in ["57P01", "57P03", "53300", "08006"] {
        let raised = sqlx::raw_sql(&format!(
            "DO $$ BEGIN RAISE EXCEPTION 'down' USING ERRCODE = '{code}'; END $$"
        ))
        .execute(&pool)
        .await
        .unwrap_err();
        assert!(matches!(classify(raised), HandleError::Unavailable(_)), "{code}");
    }
    // Any other database error (here 42P01, no such table) is transient.
    let other = sqlx::query("SELECT * FROM no_such_table")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(matches!(classify(other), HandleError::Transient(_)));
    // No database behind it at all: transient.
    assert!(matches!(classify(anyhow::anyhow!("a bug")), HandleError::Transient(_)));
    // The database down: unavailable, whether the pool is closed…
    pool.close().await;
    let closed = pool.acquire().await.unwrap_err();
    assert!(matches!(classify(closed), HandleError::Unavailable(_)));
    // …or nothing listens.
    let refused = <sqlx::PgConnection as sqlx::Connection>::connect("postgres://postgres@127.0.0.1:1/none")
        .await
        .unwrap_err();
    assert!(
        matches!(classify(refused), HandleError::Unavailable(_)),
        "connection refused"
    );
}

#[tokio::test]
async fn a_repeated_event_is_answered_again_with_its_first_replies_under_their_ids() {
    let (_db, pool) = world().await;
    let order = Uuid::new_v4();
    let (command, other) = (reserve(order), reserve(order));
    // First delivery: applied, and its reply enqueued and kept.
    let (mut tx, fresh) = begin(&pool, "c", &[at(&command, 1), at(&other, 2)]).await.unwrap();
    assert_eq!(fresh.indices(), [0, 1]);
    let span = tracing::Span::none();
    let reply = saga_kit::emit::envelope(order, &Message::StockReserved, Some(&command), &span);
    let replies = [(Message::StockReserved, reply.clone())];
    saga_kit::emit::reply_all(&mut tx, "c", &replies).await.unwrap();
    commit(tx, &fresh).await.unwrap();
    let row = |pool: PgPool| async move {
        sqlx::query_as::<_, (Uuid, bool)>("SELECT event_id, parked_at IS NULL FROM outbox")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    assert_eq!(row(pool.clone()).await, [(reply.event_id, true)]);
    // Published; then the command comes again (a deadline's re-send under
    // its first id): the same reply is pending again, no second one.
    sqlx::query("DELETE FROM outbox") // published: the relay settles a row by deleting it
        .execute(&pool)
        .await
        .unwrap();
    let (tx, fresh) = begin(&pool, "c", &[at(&command, 7)]).await.unwrap();
    assert!(fresh.is_empty());
    commit(tx, &fresh).await.unwrap();
    assert_eq!(row(pool.clone()).await, [(reply.event_id, true)]);
    // Even after the outbox row was purged: inserted again, same id, same body.
    sqlx::query("DELETE FROM outbox").execute(&pool).await.unwrap();
    let (tx, fresh) = begin(&pool, "c", &[at(&command, 9)]).await.unwrap();
    commit(tx, &fresh).await.unwrap();
    let body: serde_json::Value = sqlx::query_scalar("SELECT envelope FROM outbox WHERE event_id = $1")
        .bind(reply.event_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(body, serde_json::to_value(&reply).unwrap());
    // A repeat of an event that sent nothing sends nothing.
    sqlx::query("DELETE FROM outbox").execute(&pool).await.unwrap();
    let (tx, fresh) = begin(&pool, "c", &[at(&other, 11)]).await.unwrap();
    commit(tx, &fresh).await.unwrap();
    assert!(row(pool.clone()).await.is_empty());
    pool.close().await;
}

#[tokio::test]
async fn a_miss_is_recorded_and_counted() {
    let (_db, pool) = world().await;
    let (event, order) = (Uuid::new_v4(), Uuid::new_v4());
    let labels = [("consumer", "c"), ("caught_by", "reservation per order")];
    let before = telemetry::metrics::get("inbox_misses_total", &labels);
    let mut conn = pool.acquire().await.unwrap();
    saga_kit::consumer::note_miss(&mut conn, "c", event, order, "reservation per order")
        .await
        .unwrap();
    let row: (Uuid, Uuid) = sqlx::query_as("SELECT event_id, order_id FROM inbox_misses")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(row, (event, order));
    assert_eq!(telemetry::metrics::get("inbox_misses_total", &labels) - before, 1.0);
    drop(conn);
    pool.close().await;
}
