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
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    let (invariant, why) = layer.expected();
    assert_eq!(
        report.caught(),
        Some(true),
        "{} off: expected \"{invariant}\" to break ({why}); broken: {:?}; problems: {:?}",
        layer.name(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gateway_key_a_retried_charge_charges_again() {
    must_catch(LayerOff::GatewayKey).await;
}
