//! The supervisor over a real process: a service whose consumer task dies
//! does not limp on behind a green health check — it exits non-zero.

use std::time::Duration;

use e2e::Service;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_consumer_dies_exits_non_zero() {
    let mut stack = crate::stack("supervisor").await;
    // The consume loop fails at its first turn, as if its broker session broke for good.
    stack.arm(Service::Inventory, kafka::consumer::FAIL_LOOP);
    stack.restart_unready(Service::Inventory).await.unwrap();
    stack
        .wait_exit(Service::Inventory, Duration::from_secs(30))
        .await
        .expect("inventory-service exits on its own when its consumer dies");
    let status = stack.last_exit(Service::Inventory).expect("exit status recorded");
    assert_eq!(
        status.code(),
        Some(1),
        "a failure exit, not a crash or a clean stop: {status}"
    );
    let log = std::fs::read_to_string(stack.log_path(Service::Inventory)).unwrap();
    assert!(
        log.contains("task died") && log.contains(&format!("{} consumer", contract::topics::consumers::INVENTORY.name)),
        "the log names the task that died:\n{log}"
    );
    // Disarmed, it starts and serves again.
    stack.disarm(Service::Inventory);
    stack.start_service(Service::Inventory).await.unwrap();
    stack.shutdown(true).await.unwrap();
}

/// A quiet normal start and stop: a fresh stack serves an order end to end,
/// then ctrl-c (SIGINT) stops every service. Each exits 0, and no log line
/// of a service is a WARN or an ERROR — a periodic task that ends because
/// shutdown was asked is a clean end, a missing `~/.pgpass` is no warning.
/// Checked against two removals, each failing it: the supervisor counting a
/// task that ends in its grace period as failed (outbox-relay exited 1), and
/// the harness not waiting for the broker to hand out producer ids
/// (inventory-service logged librdkafka's "Failed to acquire idempotence
/// PID … Coordinator load in progress" WARN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_start_and_a_ctrl_c_stop_are_quiet_and_exit_zero() {
    let mut stack = crate::stack("quiet").await;
    let client = e2e::driver::Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("QUIET", 5).await.unwrap();
    let order = e2e::driver::OrderRequest {
        sku: "QUIET".into(),
        quantity: 1,
        amount_cents: 500,
        card: e2e::driver::GOOD_CARD.into(),
    };
    let done = client
        .place_and_settle(&e2e::driver::new_key(), &order)
        .await
        .expect("an order settles");
    assert_eq!(done.status, "CONFIRMED", "{done:?}");
    let exits = stack.interrupt_services().await;
    assert_eq!(exits.len(), 5, "five services were running: {exits:?}");
    let mut noisy = Vec::new();
    for (s, status) in &exits {
        let log = std::fs::read_to_string(stack.log_path(*s)).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")) {
            noisy.push(format!("{}: {line}", s.name()));
        }
        assert!(
            status.is_some_and(|st| st.success()),
            "{} did not exit 0 on SIGINT: {status:?}\n{}",
            s.name(),
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
    }
    assert!(
        noisy.is_empty(),
        "warnings or errors in a normal run:\n{}",
        noisy.join("\n")
    );
    stack.shutdown(true).await.unwrap();
}
