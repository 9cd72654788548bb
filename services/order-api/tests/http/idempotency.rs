//! Idempotency-Key semantics (IETF draft) on POST /orders and /cancel.

use std::time::Duration;

use tokio::task::JoinSet;

use crate::{TestApi, ORDER};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_requests_with_one_key_create_one_order() {
    let api = std::sync::Arc::new(TestApi::start(Duration::from_secs(3600)).await);
    let mut set = JoinSet::new();
    for _ in 0..20 {
        let api = api.clone();
        set.spawn(async move { api.post("/orders", "same-key", None, ORDER).await });
    }
    let replies: Vec<_> = set.join_all().await;
    let fresh: Vec<_> = replies.iter().filter(|r| r.status == 201 && !r.replayed).collect();
    let replayed: Vec<_> = replies.iter().filter(|r| r.status == 201 && r.replayed).collect();
    let in_flight: Vec<_> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!(
        fresh.len(),
        1,
        "exactly one execution: {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(
        fresh.len() + replayed.len() + in_flight.len(),
        20,
        "no other status (never a 5xx)"
    );
    for r in &replayed {
        assert_eq!(r.body, fresh[0].body, "replays are byte-identical");
    }
    for r in &in_flight {
        assert!(r.retry_after, "409 carries Retry-After");
        assert_eq!(r.content_type.as_deref(), Some("application/problem+json"));
    }
    assert_eq!(api.counts().await, (1, 1, 1), "one order, one outbox row, one key");
    std::sync::Arc::into_inner(api).unwrap().stop().await;
}

#[tokio::test]
async fn completed_key_replays_the_stored_response() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let first = api.post("/orders", "k1", None, ORDER).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed);
    // The same document serialised differently is the same request.
    let reordered = r#"{ "card":"4242424242424242", "amount_cents":2500, "quantity":2, "sku":"WIDGET" }"#;
    let again = api.post("/orders", "k1", None, reordered).await;
    assert_eq!((again.status, again.replayed), (201, true));
    assert_eq!(again.body, first.body);
    assert_eq!(api.counts().await, (1, 1, 1));
    api.stop().await;
}

/// The create is one statement (`idempotency::at_once`): its answer is
/// built before the order is stored, so it must be the order as stored —
/// the same ids and timestamps — and the order's command and first history
/// row must be the ones it names.
#[tokio::test]
async fn the_answer_to_a_new_order_is_the_order_as_stored() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let created = api.post("/orders", "k-stored", None, ORDER).await;
    assert_eq!(created.status, 201);
    let answer = created.json();
    let id = answer["id"].as_str().unwrap().to_owned();
    let mut shown = api.get(&format!("/orders/{id}"), "test-client").await.json();
    let history = shown.as_object_mut().unwrap().remove("history").unwrap();
    assert_eq!(shown, answer, "the answer is the stored order");
    assert_eq!(history[0]["cause"], "OrderPlaced");
    assert_eq!(history[0]["at"], answer["created_at"]);
    let (command, event_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "SELECT o.last_command_id, b.event_id FROM orders o JOIN outbox b ON b.message_key = o.id::text",
    )
    .fetch_one(&api.pool)
    .await
    .unwrap();
    assert_eq!(command, event_id, "the order waits on the command it wrote");
    api.stop().await;
}

#[tokio::test]
async fn same_key_with_a_different_request_is_422() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    assert_eq!(api.post("/orders", "k1", None, ORDER).await.status, 201);
    let other = ORDER.replace("\"quantity\":2", "\"quantity\":3");
    let reply = api.post("/orders", "k1", None, &other).await;
    assert_eq!(reply.status, 422);
    assert_eq!(reply.json()["type"], "/problems/idempotency-key-reused");
    // The same key on another path is another request too.
    let order_id = api.post("/orders", "k1", None, ORDER).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let reply = api.post(&format!("/orders/{order_id}/cancel"), "k1", None, "{}").await;
    assert_eq!(reply.status, 422);
    assert_eq!(api.counts().await.0, 1);
    api.stop().await;
}

#[tokio::test]
async fn keys_are_scoped_to_the_client() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let a = api.post("/orders", "shared", Some("client-a"), ORDER).await;
    let b = api.post("/orders", "shared", Some("client-b"), ORDER).await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.replayed, "client B must not get client A's stored response");
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(a.json()["client_id"], "client-a");
    assert_eq!(api.counts().await, (2, 2, 2));
    api.stop().await;
}

#[tokio::test]
async fn expired_keys_behave_as_new_and_are_reaped() {
    let api = TestApi::start(Duration::from_secs(1)).await;
    let first = api.post("/orders", "k-exp", None, ORDER).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let second = api.post("/orders", "k-exp", None, ORDER).await;
    assert_eq!((second.status, second.replayed), (201, false));
    assert_ne!(first.json()["id"], second.json()["id"]);
    // Two more keys expire; the reaper deletes expired rows in batches.
    api.post("/orders", "k-a", None, ORDER).await;
    api.post("/orders", "k-b", None, ORDER).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(idempotency::reap(&api.pool, 2).await.unwrap(), 2);
    assert_eq!(idempotency::reap(&api.pool, 2).await.unwrap(), 1);
    assert_eq!(idempotency::reap(&api.pool, 2).await.unwrap(), 0);
    assert_eq!(api.counts().await, (4, 4, 0), "orders stay; only keys go");
    api.stop().await;
}

#[tokio::test]
async fn validation_failures_store_nothing_and_the_key_stays_usable() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    for bad in [
        ORDER.replace("\"quantity\":2", "\"quantity\":0"),
        ORDER.replace("\"amount_cents\":2500", "\"amount_cents\":9223372036854775807"),
        ORDER.replace("\"amount_cents\":2500", "\"amount_cents\":100000001"),
        ORDER.replace("WIDGET", "WID\\u0000GET"),
        "{\"sku\":".to_owned(),
    ] {
        let refused = api.post("/orders", "k-fix", None, &bad).await;
        assert!(matches!(refused.status, 400 | 422), "{bad}: {}", refused.status);
        assert_eq!(refused.content_type.as_deref(), Some("application/problem+json"));
        assert!(!refused.replayed);
        assert_eq!(
            api.counts().await,
            (0, 0, 0),
            "{bad}: nothing written, not even the key"
        );
    }
    // The client fixes the body and retries with the same key.
    let fixed = api.post("/orders", "k-fix", None, ORDER).await;
    assert_eq!((fixed.status, fixed.replayed), (201, false));
    let largest = ORDER.replace("\"amount_cents\":2500", "\"amount_cents\":100000000");
    assert_eq!(
        api.post("/orders", "k-max", None, &largest).await.status,
        201,
        "the bound is inclusive"
    );
    // Cancelling a PENDING order is a stored 409 too.
    let id = api.post("/orders", "k-ok", None, ORDER).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let c1 = api.post(&format!("/orders/{id}/cancel"), "c1", None, "{}").await;
    assert_eq!(c1.status, 409);
    let c2 = api.post(&format!("/orders/{id}/cancel"), "c1", None, "{}").await;
    assert_eq!((c2.status, c2.replayed), (409, true));
    api.stop().await;
}
