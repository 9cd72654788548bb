//! The in-transaction crash point fires with the batch's transaction open —
//! and only when the batch holds fresh work: a crash there loses nothing
//! (the transaction dies with the process), and after a batch of
//! duplicates there is nothing it could lose. Its own binary: a fail
//! point is configured for the whole process.

use contract::{Envelope, Message};
use kafka::consumer::{Handled, Position, Traced};
use saga_kit::consumer::{apply_batch, apply_fresh, CRASH_IN_TRANSACTION};
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
    }
}

/// Runs `apply_batch` (or `apply_fresh`) on `items` in a task of its own:
/// `Err` when the crash point fired (a panic, under this test's action).
async fn run(pool: &PgPool, items: Vec<Traced<Envelope>>, fresh: bool) -> Result<Vec<Handled>, ()> {
    let pool = pool.clone();
    let task = tokio::spawn(async move {
        let insert = "INSERT INTO effects (event_id) VALUES ($1)";
        if fresh {
            apply_fresh(&pool, "c", &items, &items, |conn, fresh, items| {
                Box::pin(async move {
                    for &i in fresh {
                        sqlx::query(insert)
                            .bind(items[i].message.event_id)
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok::<_, sqlx::Error>(())
                })
            })
            .await
        } else {
            apply_batch(
                &pool,
                "c",
                &items,
                &(),
                |_, _| Box::pin(async { Ok::<_, sqlx::Error>(()) }),
                |conn, envelope, _, _| {
                    Box::pin(async move {
                        sqlx::query(insert)
                            .bind(envelope.event_id)
                            .execute(conn)
                            .await
                            .map(drop)
                    })
                },
            )
            .await
        }
        .unwrap()
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
    let (a, b) = (
        Envelope::new(Uuid::new_v4(), &message, None),
        Envelope::new(Uuid::new_v4(), &message, None),
    );
    for fresh in [false, true] {
        // Unarmed, a batch applies: `seen` is a duplicate from now on.
        let seen = Envelope::new(Uuid::new_v4(), &message, None);
        run(&pool, vec![traced(&seen)], fresh).await.unwrap();
        let before = (rows(&pool, "inbox").await, rows(&pool, "effects").await);
        fail::cfg(CRASH_IN_TRANSACTION, "panic").unwrap();
        // Duplicates only: nothing to lose, no crash.
        let handled = run(&pool, vec![traced(&seen)], fresh).await.unwrap();
        assert_eq!(handled, [Handled::Duplicate]);
        // Fresh work: the crash, with the transaction still open — nothing of
        // the batch is committed, its inbox rows included.
        let fresh_item = if fresh { &b } else { &a };
        assert!(run(&pool, vec![traced(&seen), traced(fresh_item)], fresh)
            .await
            .is_err());
        assert_eq!((rows(&pool, "inbox").await, rows(&pool, "effects").await), before);
        fail::remove(CRASH_IN_TRANSACTION);
        let handled = run(&pool, vec![traced(fresh_item)], fresh).await.unwrap();
        assert_eq!(handled, [Handled::Applied], "the redelivery applies it");
    }
    pool.close().await;
    scenario.teardown();
}
