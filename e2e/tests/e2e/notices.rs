//! A provider without idempotency keys (seed 000, strategy 2): the order's
//! confirmation notice goes to a notifier that counts every request. Both
//! honest choices, each under a crash between the send and the mark,
//! counted from the notifier's own table (`notices` in the gateway's
//! database) and the intent row (`notices` in order-api's).

use std::time::{Duration, Instant};

use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::stack::Service;
use sqlx::Connection as _;
use uuid::Uuid;

fn widget() -> OrderRequest {
    OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 900,
        card: GOOD_CARD.into(),
    }
}

/// Notices the notifier received for `order`.
async fn received(stack: &e2e::Stack, order: Uuid) -> i64 {
    let mut gateway = sqlx::PgConnection::connect(&stack.db_url("gateway")).await.unwrap();
    sqlx::query_scalar("SELECT count(*) FROM notices WHERE order_id = $1")
        .bind(order)
        .fetch_one(&mut gateway)
        .await
        .unwrap()
}

/// The intent row's status, once it is SENT (or after 30 s, whatever it is).
async fn marked(stack: &e2e::Stack, order: Uuid) -> String {
    let mut orders = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM notices WHERE order_id = $1")
            .bind(order)
            .fetch_optional(&mut orders)
            .await
            .unwrap();
        if status.as_deref() == Some("SENT") || Instant::now() > end {
            return status.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Places one order and waits until it is confirmed.
async fn confirmed_order(client: &Client) -> Uuid {
    let (order, status) = client
        .place_and_finish(&widget(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(status, "CONFIRMED");
    order
}

/// Runs one order through `delivery` with order-api crashing at `point`
/// (between the send and the mark), restarts it, and returns the notices
/// the notifier received for that order; then one more order without a
/// crash, which must get exactly one.
async fn crash_between_send_and_mark(name: &str, delivery: &str, point: &str) -> i64 {
    let mut stack = crate::stack(name).await;
    stack.set_env(Service::OrderApi, "NOTICE_DELIVERY", delivery);
    stack.set_env(Service::OrderApi, "NOTICE_INTERVAL_MS", "100");
    // The crashed worker's lease runs out soon: its notices go out again.
    stack.set_env(Service::OrderApi, "NOTICE_LEASE_MS", "1500");
    stack.arm(Service::OrderApi, point);
    stack.restart(Service::OrderApi).await.unwrap();
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    // The crash comes right after the order is confirmed (its notice is
    // intended in that transaction), before a client may see it confirmed.
    let order = client
        .place_order(&new_key(), &widget(), Duration::from_secs(10))
        .await
        .unwrap()
        .id;
    stack
        .wait_exit(Service::OrderApi, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        stack.crash_point_reports(Service::OrderApi, point),
        1,
        "the crash point fired"
    );
    stack.disarm(Service::OrderApi);
    stack.start_service(Service::OrderApi).await.unwrap();
    let finals = client.wait_terminal(&[order], Duration::from_secs(30)).await.unwrap();
    assert_eq!(finals[&order].status, "CONFIRMED");
    assert_eq!(marked(&stack, order).await, "SENT");
    // Long enough for a pending notice to go out again, many rounds over.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = received(&stack, order).await;
    let calm = confirmed_order(&client).await;
    assert_eq!(marked(&stack, calm).await, "SENT");
    assert_eq!(received(&stack, calm).await, 1, "without a crash, one notice");
    stack.shutdown(true).await.unwrap();
    got
}

/// At-least-once (send, then mark): the crash after the send leaves the row
/// PENDING, the restarted worker sends again — the customer gets two
/// notices, one more for the one crash, and none is lost. Checked against
/// the removal: marking before the send (at-most-once under this crash
/// point) leaves 1, and the assertion fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_a_crash_between_send_and_mark_sends_the_notice_twice() {
    let point = order_api::notices::CRASH_AFTER_SEND_BEFORE_MARK;
    assert_eq!(
        crash_between_send_and_mark("notice-alo", "at-least-once", point).await,
        2
    );
}

/// At-most-once (mark, then send): the crash after the mark leaves the row
/// SENT and the notifier never saw it — the notice is lost, and never sent
/// twice. Without a key or a lookup at the provider there is no third
/// choice (docs/design.md, delivery semantics).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_a_crash_between_mark_and_send_loses_the_notice() {
    let point = order_api::notices::CRASH_AFTER_MARK_BEFORE_SEND;
    assert_eq!(
        crash_between_send_and_mark("notice-amo", "at-most-once", point).await,
        0
    );
}
