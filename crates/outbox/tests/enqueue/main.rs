//! Enqueueing against a real PostgreSQL: a row exists if and only if the
//! caller's transaction committed, a batch keeps its order, and a re-send
//! under the same id makes the row pending again rather than a second row.

use outbox::OutboxEvent;
use sqlx::PgPool;
use testkit::TempDb;
use uuid::Uuid;

async fn db() -> (TempDb, PgPool) {
    TempDb::with_pool("eo_outbox", 2, vec![outbox::migrator()])
        .await
        .unwrap()
}

fn event(id: Uuid, body: &str) -> OutboxEvent<'static> {
    OutboxEvent::json("t", "order-1", id, "Happened", &body).traceparent(Some("00-tp-01"))
}

/// (event_id, topic, key, type, traceparent, body, pending) of every row, in id order.
async fn rows(pool: &PgPool) -> Vec<(Uuid, String, String, String, Option<String>, String, bool)> {
    sqlx::query_as(
        "SELECT event_id, topic, message_key, event_type, traceparent, envelope::text, parked_at IS NULL
         FROM outbox ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_row_exists_only_if_its_transaction_committed_and_a_batch_keeps_its_order() {
    let (_db, pool) = db().await;
    let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let mut tx = pool.begin().await.unwrap();
    outbox::enqueue(&mut tx, &event(a, "a")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(rows(&pool).await.is_empty(), "rolled back with the state change");

    let mut tx = pool.begin().await.unwrap();
    outbox::enqueue(&mut tx, &event(a, "a")).await.unwrap();
    // Given out of id order: the batch's order is the one given.
    outbox::enqueue_all(&mut tx, &[event(c, "c"), event(b, "b")])
        .await
        .unwrap();
    outbox::enqueue_all(&mut tx, &[]).await.unwrap();
    tx.commit().await.unwrap();
    let all = rows(&pool).await;
    let ids: Vec<Uuid> = all.iter().map(|r| r.0).collect();
    assert_eq!(ids, [a, c, b]);
    let (_, topic, key, kind, traceparent, body, pending) = &all[1];
    assert_eq!(
        (
            topic.as_str(),
            key.as_str(),
            kind.as_str(),
            traceparent.as_deref(),
            body.as_str(),
            *pending
        ),
        ("t", "order-1", "Happened", Some("00-tp-01"), "\"c\"", true)
    );
    // An event id is inserted once: enqueueing it again is an error.
    let mut conn = pool.acquire().await.unwrap();
    assert!(outbox::enqueue(&mut conn, &event(a, "again")).await.is_err());
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn a_resend_under_the_same_id_makes_a_parked_row_pending_again_or_inserts_it_again() {
    let (_db, pool) = db().await;
    let (parked, published) = (Uuid::now_v7(), Uuid::now_v7());
    let mut conn = pool.acquire().await.unwrap();
    outbox::enqueue(&mut conn, &event(parked, "k")).await.unwrap();
    sqlx::query("UPDATE outbox SET parked_at = now(), attempts = 3, last_error = 'x'")
        .execute(&mut *conn)
        .await
        .unwrap();
    // A published row has left the table: the re-send inserts it again.
    outbox::enqueue_again(&mut conn, &event(parked, "k")).await.unwrap();
    outbox::enqueue_again(&mut conn, &event(published, "p")).await.unwrap();
    let state: Vec<(Uuid, bool, i32, Option<String>)> =
        sqlx::query_as("SELECT event_id, parked_at IS NULL, attempts, last_error FROM outbox ORDER BY id")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    assert_eq!(state, [(parked, true, 0, None), (published, true, 0, None)]);
    drop(conn);
    pool.close().await;
}
