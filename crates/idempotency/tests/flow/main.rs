//! The idempotent-request flow (`idempotency::begin` → the work →
//! `idempotency::complete`) against a real PostgreSQL, including the race
//! in which another request completes the key after this one's claim.

use std::time::Duration;

use axum::http::StatusCode;
use idempotency::{Begun, Keyed, Outcome, StoredResponse};
use sqlx::{PgPool, Postgres, Transaction};
use testkit::TempDb;

/// A fresh database with an `effects` table; dropped with the guard.
async fn db() -> (PgPool, TempDb) {
    let (db, pool) = TempDb::with_tables("eo_idem", vec![idempotency::migrator()], "CREATE TABLE effects (n int)")
        .await
        .unwrap();
    (pool, db)
}

fn response(body: &str) -> StoredResponse {
    StoredResponse::json(StatusCode::CREATED, &body, "application/json")
}

const TTL: Duration = Duration::from_secs(60);

fn keyed<'a>(key: &'a str, fingerprint: &'a str) -> Keyed<'a> {
    Keyed {
        scope: "c",
        key,
        fingerprint,
        previous_fingerprint: None,
    }
}

/// `begin`, expecting the key to be this request's.
async fn claimed(pool: &PgPool, request: Keyed<'_>) -> Transaction<'static, Postgres> {
    match idempotency::begin(pool, request).await.unwrap() {
        Begun::New(tx) => tx,
        Begun::Answered(outcome) => panic!("answered without running: {outcome:?}"),
    }
}

/// `begin`, expecting an answer without running.
async fn answered(pool: &PgPool, request: Keyed<'_>) -> Outcome {
    match idempotency::begin(pool, request).await.unwrap() {
        Begun::New(_) => panic!("ran again"),
        Begun::Answered(outcome) => outcome,
    }
}

/// The request's effect, in its transaction.
async fn effect(tx: &mut Transaction<'static, Postgres>) {
    sqlx::query("INSERT INTO effects VALUES (1)")
        .execute(&mut **tx)
        .await
        .unwrap();
}

/// Another request, with `fingerprint`, completes key `k` on its own
/// connection and commits: answer "first".
async fn stored_meanwhile(pool: &PgPool, fingerprint: &str) {
    let (mut other, first) = (pool.acquire().await.unwrap(), response("first"));
    let stored = idempotency::store(&mut other, "c", "k", fingerprint, TTL, &first);
    assert!(stored.await.unwrap());
}

async fn effects(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_work_runs_once_and_its_answer_is_replayed_or_refused() {
    let (pool, _db) = db().await;
    let mut tx = claimed(&pool, keyed("k", "fp")).await;
    // While it runs, the same key is in flight.
    assert_eq!(answered(&pool, keyed("k", "fp")).await, Outcome::InFlight);
    effect(&mut tx).await;
    let outcome = idempotency::complete(&pool, tx, keyed("k", "fp"), TTL, &response("done"))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Completed(response("done")));
    assert_eq!(
        answered(&pool, keyed("k", "fp")).await,
        Outcome::Replayed(response("done"))
    );
    assert_eq!(answered(&pool, keyed("k", "other")).await, Outcome::Mismatch);
    assert_eq!(effects(&pool).await, 1, "the work ran once");
    pool.close().await;
}

#[tokio::test]
async fn a_key_completed_by_a_concurrent_request_rolls_this_one_back_and_replays_it() {
    let (pool, _db) = db().await;
    let mut tx = claimed(&pool, keyed("k", "fp")).await;
    effect(&mut tx).await;
    // Meanwhile the "first" request commits the same key elsewhere.
    stored_meanwhile(&pool, "fp").await;
    let outcome = idempotency::complete(&pool, tx, keyed("k", "fp"), TTL, &response("second"))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Replayed(response("first")),
        "the other request's answer"
    );
    assert_eq!(effects(&pool).await, 0, "this request's effect was rolled back");
    pool.close().await;
}

#[tokio::test]
async fn a_key_completed_meanwhile_for_another_request_is_a_mismatch() {
    let (pool, _db) = db().await;
    let tx = claimed(&pool, keyed("k", "fp-mine")).await;
    // The "first" request, with another body, commits the key meanwhile.
    stored_meanwhile(&pool, "fp-theirs").await;
    let outcome = idempotency::complete(&pool, tx, keyed("k", "fp-mine"), TTL, &response("second"))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Mismatch);
    pool.close().await;
}

#[tokio::test]
async fn work_rolled_back_stores_nothing_and_the_retry_runs_again() {
    let (pool, _db) = db().await;
    let mut tx = claimed(&pool, keyed("k", "fp")).await;
    effect(&mut tx).await;
    // A dependency failed: the handler rolls back, the claim goes with it.
    tx.rollback().await.unwrap();
    let tx = claimed(&pool, keyed("k", "fp")).await;
    let outcome = idempotency::complete(&pool, tx, keyed("k", "fp"), TTL, &response("ran again"))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Completed(response("ran again")));
    assert_eq!(effects(&pool).await, 0, "the failed attempt left nothing");
    pool.close().await;
}

/// `claim` of key `k` of scope `c` in a transaction of its own, left open
/// (its advisory lock held) and returned.
async fn begun(pool: &PgPool, fingerprint: &str) -> (Transaction<'static, Postgres>, idempotency::Claim) {
    let mut tx = pool.begin().await.unwrap();
    let claim = idempotency::claim(&mut tx, "c", "k", fingerprint).await.unwrap();
    (tx, claim)
}

#[tokio::test]
async fn a_claim_takes_the_key_once_and_an_expired_key_is_new_again_only_for_the_lock_holder() {
    use idempotency::Claim;
    let (pool, _db) = db().await;
    // The first takes the key; a second meanwhile is told it is in flight.
    let (mut first, begin) = begun(&pool, "fp").await;
    assert_eq!(begin, Claim::New);
    let (_, second) = begun(&pool, "fp").await;
    assert_eq!(second, Claim::InFlight);
    // Completed, it is replayed (to a differing request: a mismatch).
    let ttl = Duration::from_secs(60);
    assert!(idempotency::store(&mut first, "c", "k", "fp", ttl, &response("first"))
        .await
        .unwrap());
    first.commit().await.unwrap();
    assert_eq!(begun(&pool, "fp").await.1, Claim::Replay(response("first")));
    assert_eq!(begun(&pool, "fp-other").await.1, Claim::Mismatch);

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
    assert_eq!(meanwhile, Claim::InFlight);
    holder.rollback().await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 1);
    // …and with the lock free it is new, its old row deleted.
    let (tx, again) = begun(&pool, "fp-other").await;
    assert_eq!(again, Claim::New);
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
        idempotency::store(&mut conn, "s", key, "fp", ttl, &response(key))
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

/// The pool-by-value reaper a service's purge task calls reaps as
/// `reap` does; `lookup` reads a completed key's answer, or a mismatch.
#[tokio::test]
async fn the_purge_tasks_reaper_and_a_lookup_read_the_keys() {
    let (pool, _db) = db().await;
    let mut conn = pool.acquire().await.unwrap();
    for key in ["old-1", "old-2", "live"] {
        idempotency::store(&mut conn, "s", key, "fp", TTL, &response(key))
            .await
            .unwrap();
    }
    let found = idempotency::lookup(&mut conn, "s", "live", "fp").await.unwrap();
    assert_eq!(found, Some(idempotency::Claim::Replay(response("live"))));
    let other = idempotency::lookup(&mut conn, "s", "live", "fp-other").await.unwrap();
    assert_eq!(other, Some(idempotency::Claim::Mismatch));
    assert_eq!(idempotency::lookup(&mut conn, "s", "none", "fp").await.unwrap(), None);
    sqlx::query("UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key LIKE 'old-%'")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    assert_eq!(idempotency::reap_from(pool.clone(), 10).await.unwrap(), 2);
    assert_eq!(idempotency::reap_from(pool.clone(), 10).await.unwrap(), 0);
    pool.close().await;
}

/// The counters' help reaches the installed recorder.
#[test]
fn described_counters_render_with_their_help() {
    telemetry::metrics::install();
    idempotency::describe_metrics();
    let _ = idempotency::respond(Outcome::Replayed(response("r")));
    let page = telemetry::metrics::render();
    let (name, help) = idempotency::COUNTERS[0];
    assert!(page.contains(&format!("# HELP {name} {help}")), "{page}");
}

#[derive(Debug, PartialEq)]
enum Failed {
    /// The request's final answer: stored.
    Refused,
    /// A dependency down: not stored.
    Unavailable,
}

impl From<idempotency::Error> for Failed {
    fn from(_: idempotency::Error) -> Self {
        Failed::Unavailable
    }
}

fn stored(e: &Failed) -> Option<StoredResponse> {
    (*e == Failed::Refused).then(|| StoredResponse::json(StatusCode::UNPROCESSABLE_ENTITY, &"no", "application/json"))
}

#[tokio::test]
async fn finish_stores_a_final_error_and_rolls_any_other_back() {
    let (pool, _db) = db().await;
    // Not stored: rolled back, so the retry runs again.
    let mut tx = claimed(&pool, keyed("k1", "fp")).await;
    effect(&mut tx).await;
    let failed = idempotency::finish(&pool, tx, keyed("k1", "fp"), TTL, Err(Failed::Unavailable), stored).await;
    assert_eq!(failed.unwrap_err(), Failed::Unavailable);
    let tx = claimed(&pool, keyed("k1", "fp")).await;
    tx.rollback().await.unwrap();
    assert_eq!(effects(&pool).await, 0, "the failed attempt left nothing");
    // Final: stored with the work, and replayed.
    let mut tx = claimed(&pool, keyed("k2", "fp")).await;
    effect(&mut tx).await;
    let outcome = idempotency::finish(&pool, tx, keyed("k2", "fp"), TTL, Err(Failed::Refused), stored)
        .await
        .unwrap();
    let refusal = stored(&Failed::Refused).unwrap();
    assert_eq!(outcome, Outcome::Completed(refusal.clone()));
    assert_eq!(answered(&pool, keyed("k2", "fp")).await, Outcome::Replayed(refusal));
    assert_eq!(effects(&pool).await, 1);
    // A success is completed as with `complete`.
    let tx = claimed(&pool, keyed("k3", "fp")).await;
    let outcome = idempotency::finish(&pool, tx, keyed("k3", "fp"), TTL, Ok(response("done")), stored)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Completed(response("done")));
    pool.close().await;
}

/// Rotating the fingerprint key: a retry of a request stored under the old
/// key is replayed while the old key is still accepted (the request's
/// `previous_fingerprint`), and refused as another request once it is not.
#[tokio::test]
async fn a_retry_across_a_fingerprint_key_rotation_replays_while_the_old_key_is_accepted() {
    use idempotency::{fingerprint, FingerprintKey, Secret};
    let (pool, _db) = db().await;
    let (old, new) = (
        Secret::new(&"o".repeat(40)).unwrap(),
        Secret::new(&"n".repeat(40)).unwrap(),
    );
    let body = br#"{"sku":"WIDGET","quantity":1}"#;
    let print = |key: Secret| fingerprint(&FingerprintKey::new(key), "POST", "/orders", body);
    // Stored before the rotation, under the old key.
    let before = print(old.clone());
    let mut tx = claimed(&pool, keyed("k", &before)).await;
    effect(&mut tx).await;
    let first = response("first");
    let outcome = idempotency::complete(&pool, tx, keyed("k", &before), TTL, &first);
    assert!(matches!(outcome.await.unwrap(), Outcome::Completed(_)));
    // The retry after it, fingerprinted under the new key and the old one.
    let (now, previous) = (print(new), print(old));
    assert_ne!(now, before, "another key, another fingerprint");
    let retry = Keyed {
        previous_fingerprint: Some(&previous),
        ..keyed("k", &now)
    };
    assert_eq!(answered(&pool, retry).await, Outcome::Replayed(response("first")));
    // Once the old key is no longer accepted, the same retry is another request.
    assert_eq!(answered(&pool, keyed("k", &now)).await, Outcome::Mismatch);
    assert_eq!(effects(&pool).await, 1);
}

mod at_once;

/// `idempotency::answered` says only what a completed key says — its
/// stored answer, or a mismatch — and claims nothing: a new or in-flight
/// key is `None`, and `begin` still decides after it.
#[tokio::test]
async fn a_completed_key_is_answered_without_a_claim() {
    let (pool, _db) = db().await;
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        idempotency::answered(&mut conn, keyed("k", "fp")).await.unwrap(),
        None,
        "new"
    );
    let tx = claimed(&pool, keyed("k", "fp")).await;
    assert_eq!(
        idempotency::answered(&mut conn, keyed("k", "fp")).await.unwrap(),
        None,
        "in flight: begin answers that"
    );
    idempotency::complete(&pool, tx, keyed("k", "fp"), TTL, &response("done"))
        .await
        .unwrap();
    assert_eq!(
        idempotency::answered(&mut conn, keyed("k", "fp")).await.unwrap(),
        Some(Outcome::Replayed(response("done")))
    );
    assert_eq!(
        idempotency::answered(&mut conn, keyed("k", "other")).await.unwrap(),
        Some(Outcome::Mismatch)
    );
    // It claimed nothing: another key is still free for begin.
    assert_eq!(idempotency::answered(&mut conn, keyed("k2", "fp")).await.unwrap(), None);
    drop(claimed(&pool, keyed("k2", "fp")).await);
    drop(conn);
    pool.close().await;
}
