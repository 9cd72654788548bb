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
