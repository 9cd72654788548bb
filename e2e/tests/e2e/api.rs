//! The HTTP surface: bad input is refused with problem+json and writes nothing.

use e2e::driver::{Client, OrderRequest, GOOD_CARD};
use e2e::Service;
use sqlx::Connection;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_problem_json_and_write_nothing() {
    let stack = crate::stack("api").await;
    let http = reqwest::Client::new();
    let url = format!("{}/orders", stack.url(Service::OrderApi));
    let cases: Vec<(Option<&str>, &str, u16)> = vec![
        (
            None,
            r#"{"sku":"A","quantity":1,"amount_cents":5,"card":"4242424242424242"}"#,
            400,
        ), // no key
        (Some("k-1"), "{not json", 400),
        (Some("k-2"), r#"{"sku":"A"}"#, 422), // missing fields
        (
            Some("k-3"),
            r#"{"sku":"A","quantity":"x","amount_cents":5,"card":"4242424242424242"}"#,
            422,
        ), // wrong type
        (
            Some(""),
            r#"{"sku":"A","quantity":1,"amount_cents":5,"card":"4242424242424242"}"#,
            400,
        ), // empty key
    ];
    for (key, body, want) in cases {
        let mut req = http
            .post(&url)
            .bearer_auth(stack.api_key())
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want, "body {body:?} key {key:?}");
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        let problem: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(problem["status"], want);
        assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    let mut db = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox), (SELECT count(*) FROM idempotency_keys)",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!(counts, (0, 0, 0), "a refused request wrote something");

    // Unknown order → 404 problem; a valid order → 201 with Location.
    let resp = http
        .get(format!("{url}/{}", uuid::Uuid::new_v4()))
        .bearer_auth(stack.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    let req = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 100,
        card: GOOD_CARD.into(),
    };
    let posted = client.post_order("k-ok", &req).await.unwrap();
    assert_eq!(posted.status, 201, "{}", posted.body);

    // Inventory's stock endpoint: the bench's two-billion seed is fine, a
    // negative count or a malformed body is a problem+json 422/400.
    client.seed_stock("BIG", 2_000_000_000).await.unwrap();
    let stock = format!("{}/stock/BIG", stack.url(Service::Inventory));
    for (body, status) in [(r#"{"available":-1}"#, 422), (r#"{"available":"#, 400)] {
        let resp = http
            .put(&stock)
            .bearer_auth(&stack.secrets().operator)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{body}");
        assert_eq!(
            resp.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
    }
    assert_eq!(
        client.stock().await.unwrap()["BIG"].0,
        2_000_000_000,
        "refusals changed nothing"
    );
    stack.shutdown(true).await.unwrap();
}
