//! Layer 4 end to end: the charge survives a crash between the gateway call
//! and its record, and an ambiguous gateway timeout; cancel refunds once.

use std::time::Duration;

use e2e::driver::{Client, OrderRequest, GOOD_CARD};
use e2e::Service;
use sqlx::Connection;
use uuid::Uuid;

/// Ledger entries of one order: (kind, status).
async fn ledger(stack: &e2e::Stack, order: Uuid) -> Vec<(String, String)> {
    let mut db = sqlx::PgConnection::connect(&stack.db_url("gateway")).await.unwrap();
    sqlx::query_as("SELECT kind, status FROM ledger WHERE order_id = $1 ORDER BY created_at")
        .bind(order)
        .fetch_all(&mut db)
        .await
        .unwrap()
}

async fn metric(stack: &e2e::Stack, s: Service, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", stack.admin_url(s)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    telemetry::metrics::sum_samples(&text, name, &[])
}

fn order() -> OrderRequest {
    OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 1_234,
        card: GOOD_CARD.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_service_killed_after_the_charge_before_recording_it_charges_once() {
    let mut stack = crate::stack("crash-pay").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    stack.arm(
        Service::Payment,
        payment_service::payments::CRASH_AFTER_GATEWAY_BEFORE_RECORD,
    );
    stack.restart(Service::Payment).await.unwrap();
    let placed = client
        .place_order("k-pay", &order(), Duration::from_secs(10))
        .await
        .unwrap();
    stack
        .wait_exit(Service::Payment, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        ledger(&stack, placed.id).await,
        vec![("charge".into(), "captured".into())],
        "charged before the crash"
    );
    let mut db = sqlx::PgConnection::connect(&stack.db_url("payments")).await.unwrap();
    let status: String = sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1")
        .bind(placed.id)
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(status, "PENDING", "the crash left the payment unrecorded");
    stack.disarm(Service::Payment);
    stack.start_service(Service::Payment).await.unwrap();
    let done = client
        .wait_terminal(&[placed.id], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done[&placed.id].status, "CONFIRMED");
    assert_eq!(
        ledger(&stack, placed.id).await.len(),
        1,
        "the redelivery got the same charge back"
    );
    assert!(metric(&stack, Service::Gateway, "http_idempotent_replays_total").await >= 1.0);
    stack.shutdown(true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_commits_then_times_out_charges_once() {
    let stack = crate::stack("gw-timeout").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    // payment-service gives up after 2 s; the gateway hangs 4 s after committing.
    client
        .set_gateway_faults(serde_json::json!({"timeout_after_commit_rate": 1.0, "hang_ms": 4000}))
        .await
        .unwrap();
    let placed = client
        .place_order("k-gw", &order(), Duration::from_secs(10))
        .await
        .unwrap();
    let done = client
        .wait_terminal(&[placed.id], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done[&placed.id].status, "CONFIRMED");
    assert_eq!(
        ledger(&stack, placed.id).await,
        vec![("charge".into(), "captured".into())]
    );
    assert!(
        metric(&stack, Service::Payment, "consumer_transient_errors_total").await >= 1.0,
        "the timeout was seen"
    );
    assert!(
        metric(&stack, Service::Gateway, "http_idempotent_replays_total").await >= 1.0,
        "the retry was a replay"
    );
    stack.shutdown(true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_confirmed_order_refunds_once_and_releases_its_stock() {
    let stack = crate::stack("cancel").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    let placed = client.place_and_settle("k-c", &order()).await.unwrap();
    assert_eq!(client.stock().await.unwrap()["WIDGET"], (9, 1));
    let first = client.cancel("cancel-1", placed.id).await.unwrap();
    assert_eq!(first.status, 202, "{}", first.body);
    let again = client.cancel("cancel-1", placed.id).await.unwrap();
    assert_eq!((again.status, again.replayed), (202, true));
    let other_key = client.cancel("cancel-2", placed.id).await.unwrap();
    assert_eq!(other_key.status, 200, "already being cancelled: {}", other_key.body);
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let o = client.order(placed.id).await.unwrap();
        if o.status == "CANCELLED" {
            assert_eq!(o.cancel_reason.as_deref(), Some("customer_cancelled"));
            break;
        }
        assert!(std::time::Instant::now() < end, "stuck in {}", o.status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        ledger(&stack, placed.id).await,
        vec![
            ("charge".into(), "captured".into()),
            ("refund".into(), "refunded".into())
        ]
    );
    assert_eq!(client.stock().await.unwrap()["WIDGET"], (10, 0), "stock released");
    stack.shutdown(true).await.unwrap();
}
