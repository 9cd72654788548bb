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
