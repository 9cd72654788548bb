//! API keys, the client as the key scope, and per-client limits.

use std::time::Duration;

use order_api::auth::AuthArgs;

use crate::{Reply, TestApi, ORDER};

fn assert_problem(r: &Reply, status: u16) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.content_type.as_deref(), Some("application/problem+json"));
    assert_eq!(r.json()["status"], status);
}

#[tokio::test]
async fn no_key_or_an_unknown_key_is_a_401_and_nothing_is_stored() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let bare = api
        .http
        .post(api.url("/orders"))
        .header("idempotency-key", "k")
        .header("content-type", "application/json")
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(bare.headers()["www-authenticate"], "Bearer");
    assert_problem(&Reply::of(bare).await, 401);
    let forged = api
        .http
        .post(api.url("/orders"))
        .header("idempotency-key", "k")
        .header("x-client-id", "test-client")
        .bearer_auth("eo_0000000000000000000000000000000000000000")
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_problem(&Reply::of(forged).await, 401);
    assert_eq!(api.counts().await, (0, 0, 0));
    // The key works; only its hash is stored.
    let key = api.key("test-client").await;
    let (hash,): (String,) = sqlx::query_as("SELECT key_hash FROM api_keys")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_ne!(hash, key);
    assert_eq!(hash, order_api::auth::hash(&key));
    assert_eq!(api.post("/orders", "k", None, ORDER).await.status, 201);
    api.stop().await;
}

#[tokio::test]
async fn the_key_scope_is_the_authenticated_client_whatever_x_client_id_says() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let a = api.post("/orders", "shared", Some("client-a"), ORDER).await;
    assert_eq!(a.status, 201);
    // B names A in X-Client-Id with A's key: B's own scope, a new order.
    let b_key = api.key("client-b").await;
    let b = Reply::of(
        api.http
            .post(api.url("/orders"))
            .header("idempotency-key", "shared")
            .header("x-client-id", "client-a")
            .header("content-type", "application/json")
            .bearer_auth(b_key)
            .body(ORDER)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((b.status, b.replayed), (201, false));
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(b.json()["client_id"], "client-b");
    api.stop().await;
}

#[tokio::test]
async fn another_clients_order_is_a_404_like_an_order_that_does_not_exist() {
    let api = TestApi::start(Duration::from_secs(3600)).await;
    let a = api.post("/orders", "a-1", Some("client-a"), ORDER).await;
    let id = a.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(api.get(&format!("/orders/{id}"), "client-a").await.status, 200);
    let theirs = api.get(&format!("/orders/{id}"), "client-b").await;
    let none = api.get(&format!("/orders/{}", uuid::Uuid::now_v7()), "client-b").await;
    assert_problem(&theirs, 404);
    assert_eq!(theirs.json(), none.json(), "nothing tells the two apart");
    let cancel = api
        .post(&format!("/orders/{id}/cancel"), "b-1", Some("client-b"), "{}")
        .await;
    assert_problem(&cancel, 404);
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_ne!(status, "CANCELLING", "nothing written");
    api.stop().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413_and_a_client_over_its_rate_a_429() {
    let api = TestApi::start_with(
        Duration::from_secs(3600),
        AuthArgs {
            rate_per_sec: 0.5,
            burst: 3.0,
            max_body_bytes: 256,
            ..AuthArgs::default()
        },
    )
    .await;
    let big = format!(
        r#"{{"sku":"{}","quantity":1,"amount_cents":1,"card":"4242424242424242"}}"#,
        "W".repeat(300)
    );
    assert_problem(&api.post("/orders", "big", None, &big).await, 413);
    // The bucket holds three: three are admitted, the fourth is a 429.
    for key in ["r-1", "r-2", "r-3"] {
        assert_eq!(api.post("/orders", key, None, ORDER).await.status, 201);
    }
    let limited = api.post("/orders", "r-4", None, ORDER).await;
    assert_problem(&limited, 429);
    assert!(limited.retry_after, "429 says when to come back");
    // Another client has its own bucket.
    assert_eq!(api.post("/orders", "o-1", Some("other"), ORDER).await.status, 201);
    assert_eq!(api.counts().await.0, 4);
    api.stop().await;
}

#[tokio::test]
async fn a_revoked_key_stops_working() {
    let api = TestApi::start_with(
        Duration::from_secs(3600),
        AuthArgs {
            key_cache_secs: 0,
            ..AuthArgs::default()
        },
    )
    .await;
    assert_eq!(api.post("/orders", "k-1", None, ORDER).await.status, 201);
    let (id,): (uuid::Uuid,) = sqlx::query_as("SELECT id FROM api_keys")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert!(order_api::auth::revoke_key(&api.pool, id).await.unwrap());
    assert_problem(&api.post("/orders", "k-2", None, ORDER).await, 401);
    api.stop().await;
}

/// A flood of bad keys costs no database round trip per request: a key
/// found unknown is answered from memory after, and one address causes at
/// most its lookup allowance for fresh keys (429 past it). A client whose
/// key was looked up before is served throughout.
#[tokio::test]
async fn a_flood_of_bad_keys_does_not_reach_the_database_per_request() {
    let api = TestApi::start_with(
        Duration::from_secs(3600),
        AuthArgs {
            lookups_per_sec: 10.0,
            ..AuthArgs::default()
        },
    )
    .await;
    let good = api
        .get("/orders/00000000-0000-0000-0000-000000000000", "client-a")
        .await;
    assert_eq!(good.status, 404, "a known key, looked up once");
    let before = api.auth.lookups_made();
    let get = |key: String| {
        let req = api
            .http
            .get(api.url("/orders/00000000-0000-0000-0000-000000000000"))
            .bearer_auth(key);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // One bad key, 300 times: one lookup.
    for _ in 0..300 {
        assert_eq!(get("eo_bad".into()).await, 401);
    }
    assert_eq!(api.auth.lookups_made() - before, 1, "the unknown key is remembered");
    // 300 different bad keys from one address: the allowance (burst 40 at
    // 10/s) is looked up, the rest refused without a lookup.
    let started = std::time::Instant::now();
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    for i in 0..300 {
        *statuses.entry(get(format!("eo_bad_{i}")).await).or_default() += 1;
    }
    let allowance = 40 + (started.elapsed().as_secs_f64() * 10.0).ceil() as u64;
    let looked_up = api.auth.lookups_made() - before - 1;
    assert!(
        looked_up <= allowance,
        "{looked_up} lookups for 300 fresh bad keys (allowance {allowance})"
    );
    assert!(
        statuses.get(&429).copied().unwrap_or(0) >= 300 - allowance as u32,
        "{statuses:?}"
    );
    assert!(statuses.keys().all(|s| [401, 429].contains(s)), "{statuses:?}");
    // The known client, from the same address, is still served.
    let again = api
        .get("/orders/00000000-0000-0000-0000-000000000000", "client-a")
        .await;
    assert_eq!(again.status, 404, "{}", String::from_utf8_lossy(&again.body));
    api.stop().await;
}

#[tokio::test]
async fn concurrent_requests_with_one_uncached_key_share_one_lookup() {
    // The allowance is 4 lookups; 200 requests at once from one client
    // (as after a restart of order-api, with the client's retries queued)
    // must all be served: one lookup, no 429 (and, this test being of
    // the lookups, room in flight for all of them).
    let api = TestApi::start_configured(Duration::from_secs(3600), |config| {
        config.auth = AuthArgs {
            lookups_per_sec: 1.0,
            ..AuthArgs::default()
        };
        config.admission.max_in_flight = 256;
    })
    .await;
    let key = api.key("client-a").await;
    let before = api.auth.lookups_made();
    // The table locked: every lookup waits until all requests are in.
    let mut lock = api.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let unlock = async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lock.commit().await.unwrap();
    };
    let requests = (0..200).map(|_| {
        let req = api
            .http
            .get(api.url("/orders/00000000-0000-0000-0000-000000000000"))
            .bearer_auth(&key);
        async move { req.send().await.unwrap().status().as_u16() }
    });
    let (statuses, ()) = tokio::join!(futures::future::join_all(requests), unlock);
    let mut counts = std::collections::BTreeMap::<u16, u32>::new();
    for s in statuses {
        *counts.entry(s).or_default() += 1;
    }
    assert_eq!(counts, [(404, 200)].into(), "every request served");
    assert_eq!(api.auth.lookups_made() - before, 1, "one lookup for 200 requests");
    api.stop().await;
}

/// The audit trail: a key that opens nothing is written with where it came
/// from, a refusal once per (client, reason) a minute, a key's creation
/// and revocation with the operator as the actor; an expired key opens
/// nothing. Removals tried: the lookup's audit insert dropped, and the
/// expiry condition dropped — each failed this.
#[tokio::test]
async fn the_audit_trail_keeps_failed_keys_refusals_and_key_changes_and_an_expired_key_opens_nothing() {
    let api = TestApi::start_with(
        Duration::from_secs(3600),
        AuthArgs {
            rate_per_sec: 0.1,
            burst: 1.0,
            key_cache_secs: 0,
            ..AuthArgs::default()
        },
    )
    .await;
    let with_key = |key: String| {
        let http = api.http.clone();
        let url = api.url("/orders/00000000-0000-0000-0000-000000000000");
        async move { http.get(url).bearer_auth(key).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(with_key("eo_not_a_key_at_all".into()).await, 401);
    let expired = order_api::auth::create_key_expiring(
        &api.pool,
        "late-client",
        Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
    )
    .await
    .unwrap();
    assert_eq!(with_key(expired.1).await, 401, "an expired key opens nothing");
    let (id, key) = order_api::auth::create_key(&api.pool, "busy-client").await.unwrap();
    assert_eq!(with_key(key.clone()).await, 404, "the key works");
    for _ in 0..3 {
        assert_eq!(with_key(key.clone()).await, 429, "past its burst");
    }
    // The refusal is written in the background: wait for it, so that the
    // revocation after it is the last row (it once raced ahead).
    let end = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let refused: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'refused'")
            .fetch_one(&api.pool)
            .await
            .unwrap();
        if refused > 0 || std::time::Instant::now() > end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(order_api::auth::revoke_key(&api.pool, id).await.unwrap());
    let trail: Vec<(String, String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT actor, action, subject, source FROM audit_log ORDER BY id")
            .fetch_all(&api.pool)
            .await
            .unwrap();
    let actions: Vec<(&str, &str)> = trail.iter().map(|(a, b, _, _)| (a.as_str(), b.as_str())).collect();
    assert_eq!(
        actions,
        [
            ("unknown", "auth.failed"),
            ("operator", "api_key.created"),
            ("unknown", "auth.failed"),
            ("operator", "api_key.created"),
            ("busy-client", "refused"),
            ("operator", "api_key.revoked"),
        ],
        "{trail:#?}"
    );
    assert_eq!(trail[0].3.as_deref(), Some("127.0.0.1"), "from where");
    assert!(
        trail[0].2.as_deref().unwrap().starts_with("key sha256 "),
        "never the key"
    );
    assert_eq!(trail[4].2.as_deref(), Some("rate_limited"));
    assert_eq!(trail[5].2, Some(id.to_string()));
    api.stop().await;
}
