//! The in-transaction crash point fires with the batch's transaction open —
//! and only when the batch holds fresh work: a crash there loses nothing
//! (the transaction dies with the process), and after a batch of
//! duplicates there is nothing it could lose. Its own binary: a fail
//! point is configured for the whole process.

use contract::{Envelope, Message};
use kafka::consumer::{Handled, Position, Traced};
use saga_kit::consumer::{begin, commit, CRASH_IN_TRANSACTION};
use sqlx::PgPool;
use uuid::Uuid;

fn traced(envelope: &Envelope) -> Traced<Envelope> {
    Traced {
        message: envelope.clone(),
        span: tracing::Span::none(),
        position: Some(Position {
            partition: 0,
            offset: 0,
        }),
        producer: None,
        header_event_id: None,
    }
}

/// A handler's transaction over `items` in a task of its own: `Err` when
/// the crash point fired (a panic, under this test's action).
async fn run(pool: &PgPool, items: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, ()> {
    let pool = pool.clone();
    let task = tokio::spawn(async move {
        let (mut tx, fresh) = begin(&pool, "c", &items).await.unwrap();
        for i in fresh.indices() {
            sqlx::query("INSERT INTO effects (event_id) VALUES ($1)")
                .bind(items[i].message.event_id)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        commit(tx, &fresh).await.unwrap()
    });
    task.await.map_err(|e| assert!(e.is_panic(), "{e}"))
}

async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_crash_point_fires_inside_the_transaction_and_only_on_fresh_work() {
    let scenario = fail::FailScenario::setup();
    let (_db, pool) = testkit::TempDb::with_tables(
        "eo_sagakit_crash",
        vec![inbox::migrator()],
        "CREATE TABLE effects (event_id uuid NOT NULL)",
    )
    .await
    .unwrap();
    let message = Message::ReleaseStock;
    // Unarmed, a batch applies: `seen` is a duplicate from now on.
    let seen = Envelope::new(Uuid::new_v4(), &message, None);
    run(&pool, vec![traced(&seen)]).await.unwrap();
    let before = (rows(&pool, "inbox").await, rows(&pool, "effects").await);
    fail::cfg(CRASH_IN_TRANSACTION, "panic").unwrap();
    // Duplicates only: nothing to lose, no crash.
    assert_eq!(run(&pool, vec![traced(&seen)]).await.unwrap(), [Handled::Duplicate]);
    // Fresh work: the crash, with the transaction still open — nothing of
    // the batch is committed, its inbox rows included.
    let fresh = Envelope::new(Uuid::new_v4(), &message, None);
    assert!(run(&pool, vec![traced(&seen), traced(&fresh)]).await.is_err());
    assert_eq!((rows(&pool, "inbox").await, rows(&pool, "effects").await), before);
    fail::remove(CRASH_IN_TRANSACTION);
    let handled = run(&pool, vec![traced(&fresh)]).await.unwrap();
    assert_eq!(handled, [Handled::Applied], "the redelivery applies it");
    pool.close().await;
    scenario.teardown();
}
