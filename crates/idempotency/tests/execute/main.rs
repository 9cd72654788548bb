//! `idempotency::execute` against a real PostgreSQL, including the race in
//! which another request completes the key after this one's snapshot.

use std::time::Duration;

use axum::http::StatusCode;
use idempotency::{Keyed, Outcome, StoredResponse};
use sqlx::PgPool;
use testkit::TempDb;

/// A fresh database with an `effects` table; dropped with the guard.
async fn db() -> (PgPool, TempDb) {
    let (db, pool) = TempDb::with_tables("eo_idem", vec![idempotency::migrator()], "CREATE TABLE effects (n int)")
        .await
        .unwrap();
    (pool, db)
}

#[derive(Debug)]
struct Failed;

impl From<idempotency::Error> for Failed {
    fn from(_: idempotency::Error) -> Self {
        Failed
    }
}

fn response(body: &str) -> StoredResponse {
    StoredResponse::json(StatusCode::CREATED, &body, "application/json")
}

#[tokio::test]
async fn a_key_completed_by_a_concurrent_request_rolls_this_one_back_and_replays_it() {
    let (pool, _db) = db().await;
    let request = Keyed {
        scope: "c",
        key: "k",
        fingerprint: "fp",
    };
    let other = pool.clone();
    let work: idempotency::Work<Failed> = Box::new(move |conn| {
        Box::pin(async move {
            sqlx::query("INSERT INTO effects VALUES (1)")
                .execute(&mut *conn)
                .await
                .unwrap();
            // Meanwhile the "first" request commits the same key elsewhere.
            let mut c = other.acquire().await.unwrap();
            assert!(
                idempotency::complete(&mut c, "c", "k", "fp", Duration::from_secs(60), &response("first"))
                    .await
                    .unwrap()
            );
            Ok(response("second"))
        })
    });
    let outcome = idempotency::execute(&pool, request, Duration::from_secs(60), work, |_| None)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Replayed(response("first")),
        "the other request's answer"
    );
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 0, "this request's effect was rolled back");
    pool.close().await;
}

#[tokio::test]
async fn infrastructure_errors_store_nothing_and_final_errors_are_stored() {
    let (pool, _db) = db().await;
    let fail: idempotency::Work<Failed> = Box::new(|conn| {
        Box::pin(async move {
            sqlx::query("INSERT INTO effects VALUES (1)")
                .execute(&mut *conn)
                .await
                .unwrap();
            Err(Failed)
        })
    });
    let request = Keyed {
        scope: "c",
        key: "k1",
        fingerprint: "fp",
    };
    assert!(
        idempotency::execute(&pool, request, Duration::from_secs(60), fail, |_| None)
            .await
            .is_err()
    );
    let ok: idempotency::Work<Failed> = Box::new(|_| Box::pin(async { Ok(response("ran again")) }));
    let outcome = idempotency::execute(&pool, request, Duration::from_secs(60), ok, |_| None)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Completed(response("ran again")), "a retry runs again");
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 0, "the failed attempt left nothing");

    let refuse: idempotency::Work<Failed> = Box::new(|_| Box::pin(async { Err(Failed) }));
    let request = Keyed {
        scope: "c",
        key: "k2",
        fingerprint: "fp",
    };
    let stored = |_: &Failed| {
        Some(StoredResponse::json(
            StatusCode::UNPROCESSABLE_ENTITY,
            &"no",
            "application/json",
        ))
    };
    let first = idempotency::execute(&pool, request, Duration::from_secs(60), refuse, stored)
        .await
        .unwrap();
    assert!(matches!(first, Outcome::Completed(ref r) if r.status == 422));
    let never: idempotency::Work<Failed> = Box::new(|_| Box::pin(async { panic!("must not run again") }));
    let again = idempotency::execute(&pool, request, Duration::from_secs(60), never, |_| None)
        .await
        .unwrap();
    assert!(matches!(again, Outcome::Replayed(ref r) if r.status == 422));
    pool.close().await;
}

#[tokio::test]
async fn a_key_completed_meanwhile_for_another_request_is_a_mismatch() {
    let (pool, _db) = db().await;
    let request = Keyed {
        scope: "c",
        key: "k",
        fingerprint: "fp-mine",
    };
    let other = pool.clone();
    let work: idempotency::Work<Failed> = Box::new(move |_| {
        Box::pin(async move {
            // The "first" request, with another body, commits the key meanwhile.
            let mut c = other.acquire().await.unwrap();
            let ttl = Duration::from_secs(60);
            assert!(
                idempotency::complete(&mut c, "c", "k", "fp-theirs", ttl, &response("first"))
                    .await
                    .unwrap()
            );
            Ok(response("second"))
        })
    });
    let outcome = idempotency::execute(&pool, request, Duration::from_secs(60), work, |_| None)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Mismatch);
    pool.close().await;
}

/// `begin` for key `k` of scope `c` in a transaction of its own, left open
/// (its advisory lock held) and returned.
async fn begun(pool: &PgPool, fingerprint: &str) -> (sqlx::Transaction<'static, sqlx::Postgres>, idempotency::Begin) {
    let mut tx = pool.begin().await.unwrap();
    let begin = idempotency::begin(&mut tx, "c", "k", fingerprint).await.unwrap();
    (tx, begin)
}

#[tokio::test]
async fn begin_takes_the_key_once_and_an_expired_key_is_new_again_only_for_the_lock_holder() {
    use idempotency::Begin;
    let (pool, _db) = db().await;
    // The first takes the key; a second meanwhile is told it is in flight.
    let (mut first, begin) = begun(&pool, "fp").await;
    assert_eq!(begin, Begin::New);
    let (_, second) = begun(&pool, "fp").await;
    assert_eq!(second, Begin::InFlight);
    // Completed, it is replayed (to a differing request: a mismatch).
    let ttl = Duration::from_secs(60);
    assert!(
        idempotency::complete(&mut first, "c", "k", "fp", ttl, &response("first"))
            .await
            .unwrap()
    );
    first.commit().await.unwrap();
    assert_eq!(begun(&pool, "fp").await.1, Begin::Replay(response("first")));
    assert_eq!(begun(&pool, "fp-other").await.1, Begin::Mismatch);

    // Expired: while another holds the lock it is in flight and stays stored…
    sqlx::query("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('c' || chr(31) || 'k', 7))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let (_, meanwhile) = begun(&pool, "fp").await;
    assert_eq!(meanwhile, Begin::InFlight);
    holder.rollback().await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 1);
    // …and with the lock free it is new, its old row deleted.
    let (tx, again) = begun(&pool, "fp-other").await;
    assert_eq!(again, Begin::New);
    tx.commit().await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);
    pool.close().await;
}

#[tokio::test]
async fn the_reaper_deletes_expired_keys_only_a_batch_at_a_time() {
    let (pool, _db) = db().await;
    let mut conn = pool.acquire().await.unwrap();
    for key in ["a", "b", "c", "live"] {
        let ttl = Duration::from_secs(60);
        idempotency::complete(&mut conn, "s", key, "fp", ttl, &response(key))
            .await
            .unwrap();
    }
    sqlx::query("UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key <> 'live'")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    assert_eq!(idempotency::reap(&pool, 2).await.unwrap(), 2);
    assert_eq!(idempotency::reap(&pool, 2).await.unwrap(), 1);
    assert_eq!(idempotency::reap(&pool, 2).await.unwrap(), 0);
    let left: Vec<String> = sqlx::query_scalar("SELECT key FROM idempotency_keys")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["live"]);
    pool.close().await;
}
