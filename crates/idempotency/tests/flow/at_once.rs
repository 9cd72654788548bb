//! `idempotency::at_once`: the key, the work and the answer in one
//! statement, and how it meets the longer flow on the same key.

use super::*;
use sqlx::{PgConnection, Row};

/// The one statement, with the work of inserting an effect; how many
/// effects it wrote (1 when the key was new, 0 when it was taken).
async fn at_once(conn: &mut PgConnection, request: Keyed<'_>, answer: &StoredResponse) -> i64 {
    let sql = format!(
        "WITH {}, w AS (INSERT INTO effects SELECT 1 FROM k RETURNING n) SELECT count(*) AS done FROM w",
        idempotency::at_once::KEY_CTE
    );
    let statement = idempotency::at_once::bind(sqlx::query(&sql), request, TTL, answer);
    statement.fetch_one(conn).await.unwrap().get("done")
}

#[tokio::test]
async fn a_new_key_runs_the_work_once_and_a_taken_one_does_nothing() {
    let (pool, _db) = db().await;
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(at_once(&mut conn, keyed("k", "fp"), &response("done")).await, 1);
    assert_eq!(at_once(&mut conn, keyed("k", "fp"), &response("again")).await, 0);
    assert_eq!(at_once(&mut conn, keyed("k", "other"), &response("other")).await, 0);
    assert_eq!(effects(&pool).await, 1, "the work ran once");
    // The longer flow answers the taken key: the stored answer, or a mismatch.
    assert_eq!(
        answered(&pool, keyed("k", "fp")).await,
        Outcome::Replayed(response("done"))
    );
    assert_eq!(answered(&pool, keyed("k", "other")).await, Outcome::Mismatch);
}

#[tokio::test]
async fn the_same_key_at_once_twice_concurrently_runs_the_work_once() {
    let (pool, _db) = db().await;
    let mut first = pool.begin().await.unwrap();
    assert_eq!(at_once(&mut first, keyed("k", "fp"), &response("first")).await, 1);
    // The second waits on the key's unique index until the first ends.
    let second = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            at_once(&mut conn, keyed("k", "fp"), &response("second")).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "the second did not wait for the first");
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), 0);
    assert_eq!(effects(&pool).await, 1);
}

#[tokio::test]
async fn a_key_in_flight_under_the_longer_flow_is_decided_by_the_first_to_store() {
    let (pool, _db) = db().await;
    let mut tx = claimed(&pool, keyed("k", "fp")).await;
    effect(&mut tx).await;
    // The claim is an advisory lock, no row: the one statement stores first…
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(at_once(&mut conn, keyed("k", "fp"), &response("at once")).await, 1);
    // …and the longer flow, finding the key taken, rolls its work back and
    // answers with the stored one.
    let outcome = idempotency::complete(&pool, tx, keyed("k", "fp"), TTL, &response("longer"))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Replayed(response("at once")));
    assert_eq!(effects(&pool).await, 1, "one of the two works committed");
}

#[tokio::test]
async fn an_expired_key_is_left_to_the_longer_flow() {
    let (pool, _db) = db().await;
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(at_once(&mut conn, keyed("k", "fp"), &response("old")).await, 1);
    sqlx::query("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        at_once(&mut conn, keyed("k", "fp"), &response("new")).await,
        0,
        "expired is still taken here"
    );
    let mut tx = claimed(&pool, keyed("k", "fp")).await;
    effect(&mut tx).await;
    let outcome = idempotency::complete(&pool, tx, keyed("k", "fp"), TTL, &response("new")).await;
    assert_eq!(outcome.unwrap(), Outcome::Completed(response("new")));
    assert_eq!(effects(&pool).await, 2);
}
