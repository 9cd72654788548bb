//! The chaos suite at CI size, and its negative control.

use e2e::chaos::{self, ChaosConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_finds_no_double_charge_and_loses_nothing() {
    let _slot = crate::exclusive().await;
    let cfg = ChaosConfig::ci(20261130);
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    assert!(report.passed(), "{:?}", report.problems);
    assert!(report.orders >= 300);
    assert_eq!(
        report.faults_fired.len(),
        12,
        "every fault kind fired: {:?}",
        report.faults_fired
    );
    assert!(report.duplicates.delivered() > 0, "duplicates were delivered");
    assert!(report.duplicates.total_absorbed() > 0, "and absorbed");
    assert!(report.audit.double_charged.is_empty() && report.audit.lost.is_empty() && report.audit.stuck.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_control_without_dedup_finds_double_charges() {
    let _slot = crate::exclusive().await;
    let mut cfg = ChaosConfig::ci(20261130);
    cfg.orders = 150;
    cfg.negative_control = true;
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    assert!(
        !report.audit.double_charged.is_empty(),
        "with deduplication off the same fault schedule must find double charges"
    );
}
