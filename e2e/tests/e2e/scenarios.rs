//! Scenarios of docs/scenarios.md that need real processes, each with the
//! removal it was checked against.

use std::time::Duration;

use e2e::driver::{Client, OrderRequest, GOOD_CARD};
use e2e::stack::Service;

/// Scenario 15 — acknowledging before processing loses messages. inventory
/// dies while handling a ReserveStock (crash point `consumer::while_handling`:
/// 3 s into the handler, before its transaction, with offsets committed
/// every 100 ms). Because the offset is stored only after the handler's
/// transaction, the restarted consumer gets the command again and the order
/// completes. Checked against the removal: with the offset stored before the
/// handler runs (`store_offset` moved above `self.handle`), the 100 ms
/// commit lands during the 3 s, the command is never seen again, and the
/// order stays PENDING — this test fails on `wait_terminal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_15_a_consumer_that_dies_mid_handling_gets_the_message_again() {
    let mut stack = crate::stack("scenario15").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    stack.set_env(Service::Inventory, "KAFKA_COMMIT_INTERVAL_MS", "100");
    stack.arm(Service::Inventory, kafka::consumer::CRASH_WHILE_HANDLING);
    stack.restart(Service::Inventory).await.unwrap();
    let order = client
        .place_order(
            "scenario-15",
            &OrderRequest {
                sku: "WIDGET".into(),
                quantity: 1,
                amount_cents: 700,
                card: GOOD_CARD.into(),
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    stack
        .wait_exit(Service::Inventory, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        stack.crash_point_reports(Service::Inventory, kafka::consumer::CRASH_WHILE_HANDLING),
        1,
        "inventory died at the crash point, by its own report"
    );
    stack.disarm(Service::Inventory);
    stack.start_service(Service::Inventory).await.unwrap();
    let finals = client
        .wait_terminal(&[order.id], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        finals[&order.id].status, "CONFIRMED",
        "the command was handled after the crash"
    );
    let (available, reserved) = client.stock().await.unwrap()["WIDGET"];
    assert_eq!((available, reserved), (9, 1), "reserved once");
    stack.shutdown(true).await.unwrap();
}
