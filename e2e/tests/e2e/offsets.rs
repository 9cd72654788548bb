//! Lazy offset commits over a real process: offsets are committed in the
//! background, so a SIGKILL loses every commit since the last one — and the
//! inbox must absorb every message handled but not committed.

use std::time::Duration;

use e2e::driver::{Client, OrderRequest, GOOD_CARD};
use e2e::Service;
use sqlx::Connection;

const ORDERS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_with_many_handled_but_uncommitted_offsets_is_absorbed_by_the_inbox() {
    let mut stack = crate::stack("offsets").await;
    // inventory-service commits no offset while it runs (an interval far
    // beyond the test): every message it handles stays uncommitted.
    stack.set_env(Service::Inventory, "KAFKA_COMMIT_INTERVAL_MS", "3600000");
    stack.restart(Service::Inventory).await.unwrap();
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 1_000).await.unwrap();
    let order = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 2,
        amount_cents: 900,
        card: GOOD_CARD.into(),
    };
    let mut ids = Vec::new();
    for i in 0..ORDERS {
        let placed = client
            .place_order(&format!("lazy-{i}"), &order, Duration::from_secs(10))
            .await
            .unwrap();
        ids.push(placed.id);
    }
    client.wait_terminal(&ids, Duration::from_secs(120)).await.unwrap();

    // Every ReserveStock was handled, none committed: kill without a goodbye.
    stack.kill(Service::Inventory).await.unwrap();
    stack.set_env(Service::Inventory, "KAFKA_COMMIT_INTERVAL_MS", "");
    stack.start_service(Service::Inventory).await.unwrap();

    // The restarted consumer reads them all again; the inbox absorbs each.
    let mut db = sqlx::PgConnection::connect(&stack.db_url("inventory")).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let absorbed = loop {
        let n: i64 = sqlx::query_scalar("SELECT COALESCE(sum(redeliveries), 0)::int8 FROM inbox_redeliveries")
            .fetch_one(&mut db)
            .await
            .unwrap();
        if n >= ORDERS as i64 || std::time::Instant::now() > deadline {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        absorbed >= ORDERS as i64,
        "only {absorbed} of {ORDERS} handled-but-uncommitted messages came back and were absorbed \
         (were offsets committed eagerly after all?)"
    );
    // Absorbed, not applied again: each order reserved its units once.
    let (available, reserved) = client.stock().await.unwrap()["WIDGET"];
    assert_eq!(available, 1_000 - 2 * ORDERS as i64, "stock taken once per order");
    assert_eq!(reserved, 2 * ORDERS as i64);
    let reservations: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(reservations, ORDERS as i64);
    // And the restarted consumer commits as it goes: a second restart finds nothing to redo.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack.restart(Service::Inventory).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again: i64 = sqlx::query_scalar("SELECT COALESCE(sum(redeliveries), 0)::int8 FROM inbox_redeliveries")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(again, absorbed, "offsets were committed after the first restart");
    stack.shutdown(true).await.unwrap();
}
