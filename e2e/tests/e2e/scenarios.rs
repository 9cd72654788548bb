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
/// completes — on the redelivery, not on the deadline reconciler's re-send
/// (deadlines of 15 s here, so a rescue would happen inside the wait: the
/// history must show none). Checked against the removal: with the offset
/// committed before the handler runs (`UNSAFE_OFFSET_BEFORE_HANDLING=true`
/// on inventory), the command is never seen again; the reconciler re-sends
/// it at 15 s and the order ends CONFIRMED — and this test fails on the
/// history's `Resent:ReserveStock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_15_a_consumer_that_dies_mid_handling_gets_the_message_again() {
    let mut stack = crate::stack("scenario15").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    for state in ["PENDING", "AWAITING_PAYMENT", "REFUNDING", "CANCELLING"] {
        stack.set_env(Service::OrderApi, &format!("SAGA_DEADLINE_{state}_SECS"), "15");
    }
    stack.set_env(Service::OrderApi, "RECONCILE_INTERVAL_SECS", "1");
    stack.restart(Service::OrderApi).await.unwrap();
    stack.set_env(Service::Inventory, "KAFKA_COMMIT_INTERVAL_MS", "100");
    if let Ok(v) = std::env::var("SCENARIO_15_UNSAFE_OFFSET_BEFORE_HANDLING") {
        // The removal, on demand: `SCENARIO_15_UNSAFE_OFFSET_BEFORE_HANDLING=true`.
        stack.set_env(Service::Inventory, "UNSAFE_OFFSET_BEFORE_HANDLING", &v);
    }
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
    let mut orders = sqlx::Connection::connect(&stack.db_url("orders")).await.unwrap();
    let rescued = e2e::invariants::rescued(&mut orders).await.unwrap();
    assert!(
        rescued.per_cause.is_empty(),
        "the order was finished by the deadline reconciler, not by the redelivery: {:?}",
        rescued.evidence
    );
    stack.shutdown(true).await.unwrap();
}
