//! A negative control per layer: with any one layer of deduplication
//! switched off, the chaos suite must fail and name the invariant that
//! broke — otherwise the passing runs would not show that layer works.
//! (The suite with every layer on is `chaos::chaos_run_finds_no_double_charge_and_loses_nothing`.)

use e2e::chaos::{self, ChaosConfig, LayerOff};

async fn must_catch(layer: LayerOff) {
    let _slot = crate::exclusive().await;
    let mut cfg = ChaosConfig::ci(20261130);
    cfg.orders = 150;
    cfg.layer_off = Some(layer);
    // The layer is this run's subject: one Kafka node keeps the six runs
    // short. The replicated cluster is the passing run's and the negative
    // control's (chaos.rs).
    cfg.brokers = 1;
    // Long enough for the reconciler's first re-send (60 s deadline, 5 s
    // scans) to rescue an order lost late in the load: the two unsafe
    // consumers must be caught with it on, not before it acts.
    cfg.quiesce_timeout = std::time::Duration::from_secs(100);
    // The report (and its picture) kept under target/ for a look afterwards.
    cfg.report_dir = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/chaos")
            .join(format!("layer-off-{}", layer.name())),
    );
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    let e = layer.expected();
    assert_eq!(
        report.caught(),
        Some(true),
        "{} off: expected \"{}\" to break, shown by {} ({}); broken: {:?}; problems: {:?}",
        layer.name(),
        e.invariant,
        e.effect,
        e.why,
        report.broken(),
        report.problems
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_http_key_a_retry_makes_a_second_order() {
    must_catch(LayerOff::HttpKey).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_event_ids_minted_at_publish_a_republished_row_is_applied_again() {
    must_catch(LayerOff::EventIdAtPublish).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_order_saga_inbox_redelivered_replies_reach_the_state_machine() {
    must_catch(LayerOff::OrderSagaInbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_inventory_inbox_redelivered_commands_reach_the_reservation() {
    must_catch(LayerOff::InventoryInbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_payment_inbox_redelivered_commands_reach_the_payment() {
    must_catch(LayerOff::PaymentInbox).await;
}

/// The seeds' core rule: the inbox row and the effect commit in one
/// transaction. Committed apart, a crash between them leaves the event
/// "processed" with no effect: the redelivery and every deadline re-send
/// are absorbed, and the order never gets its reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_inbox_row_committed_before_the_effect_a_crash_between_them_loses_the_effect() {
    must_catch(LayerOff::InboxSeparateTx).await;
}

/// Acknowledge before processing: a crash after the offset commit and
/// before the handler loses the batch. The reconciler re-sends the lost
/// commands at their deadline and the orders may still end CONFIRMED — the
/// audit reads the history and fails the run for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_offsets_committed_before_handling_a_crash_loses_messages_even_with_the_reconciler_on() {
    must_catch(LayerOff::OffsetBeforeHandling).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gateway_key_a_retried_charge_charges_again() {
    must_catch(LayerOff::GatewayKey).await;
}
