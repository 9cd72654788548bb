//! Admission control on the real API: a request beyond the places in
//! flight, or one that cannot reach its transaction within its deadline,
//! is a 503 with `Retry-After` that stored nothing — its retry with the
//! same key creates the order — and a transaction once begun is never cut.

use std::time::Duration;

use crate::{Reply, TestApi, ORDER};

/// A 503 of admission control: problem+json, `Retry-After`, its type.
fn assert_overloaded(reply: &Reply, why: &str) {
    assert_eq!(reply.status, 503, "{}", String::from_utf8_lossy(&reply.body));
    assert!(reply.retry_after, "a 503 of admission carries Retry-After");
    assert_eq!(reply.content_type.as_deref(), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(problem["type"], "/problems/overloaded");
    assert!(problem["detail"].as_str().unwrap().contains(why), "{problem}");
}

/// An API whose requests have 300 ms to reach their transaction (and
/// `pool_size` connections, when given), its key looked up once already.
async fn with_deadline(pool_size: Option<u32>) -> TestApi {
    let api = TestApi::start_configured(Duration::from_secs(3600), |config| {
        config.admission.deadline_ms = 300;
        // A new card's decline count reads `orders`, which these tests lock
        // to hold a request inside its transaction: not counted here.
        config.auth.declines_per_hour = 0;
        if let Some(n) = pool_size {
            config.db.pool_size = n;
        }
    })
    .await;
    let seen = api
        .get("/orders/00000000-0000-0000-0000-000000000000", "test-client")
        .await;
    assert_eq!(seen.status, 404);
    api
}

/// Locks `orders` until the returned transaction ends: a create waits
/// inside its own transaction.
async fn lock_orders(api: &TestApi) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut lock = api.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    lock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_places_in_flight_is_refused_at_once_and_its_retry_succeeds() {
    let api = std::sync::Arc::new(
        TestApi::start_configured(Duration::from_secs(3600), |config| {
            config.admission.max_in_flight = 1;
            config.admission.deadline_ms = 30_000;
        })
        .await,
    );
    // The key known (cached) first: the held request waits on `orders` only.
    let seen = api
        .get("/orders/00000000-0000-0000-0000-000000000000", "test-client")
        .await;
    assert_eq!(seen.status, 404);
    let lock = lock_orders(&api).await;
    let held = {
        let api = api.clone();
        tokio::spawn(async move { api.post("/orders", "first", None, ORDER).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let refused = api.post("/orders", "second", None, ORDER).await;
    assert_overloaded(&refused, "limit of requests in flight");
    assert!(started.elapsed() < Duration::from_secs(2), "refused at once");
    lock.commit().await.unwrap();
    assert_eq!(held.await.unwrap().status, 201);
    assert_eq!(api.counts().await, (1, 1, 1), "the refused request stored nothing");
    let retried = api.post("/orders", "second", None, ORDER).await;
    assert_eq!((retried.status, retried.replayed), (201, false), "the retry runs it");
    assert_eq!(api.counts().await, (2, 2, 2));
    std::sync::Arc::into_inner(api).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_reach_its_transaction_in_time_is_a_503_that_stores_nothing() {
    let api = with_deadline(Some(1)).await;
    // The pool's one connection held: the request cannot take one in time.
    let held = api.pool.acquire().await.unwrap();
    let late = api.post("/orders", "late", None, ORDER).await;
    assert_overloaded(&late, "did not reach its transaction in time");
    drop(held);
    assert_eq!(api.counts().await, (0, 0, 0), "nothing stored");
    let retried = api.post("/orders", "late", None, ORDER).await;
    assert_eq!((retried.status, retried.replayed), (201, false));
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_begun_in_time_runs_to_its_end_past_the_deadline() {
    let api = with_deadline(None).await;
    let lock = lock_orders(&api).await;
    let unlock = async move {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        lock.commit().await.unwrap();
    };
    // The request claims its key and waits on `orders` inside its
    // transaction, past its deadline: it is answered as it ended.
    let (placed, ()) = tokio::join!(api.post("/orders", "slow", None, ORDER), unlock);
    assert_eq!(placed.status, 201, "{}", String::from_utf8_lossy(&placed.body));
    assert_eq!(api.counts().await, (1, 1, 1));
    api.stop().await;
}
