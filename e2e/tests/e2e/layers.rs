//! A negative control per layer: with any one layer of deduplication
//! switched off, the chaos suite must fail and name the invariant that
//! broke — otherwise the passing runs would not show that layer works.
//! Each run is the ordinary one (`chaos::chaos_run_finds_no_double_charge_and_loses_nothing`:
//! same seed, fault kinds, three-node cluster and order count) with one
//! switch set; the seed changes from run to run and is printed with its
//! replay line.
//!
//! A run takes over two minutes, so the test command takes a share of the
//! matrix: [`LayerOff::SHARE`] switches chosen by its seed
//! (`this_runs_share_of_the_catch_matrix`), consecutive seeds going round
//! all ten. Each switch's own test below is ignored by the test command and
//! runs with `cargo test -p e2e --test e2e -- --ignored layers::`; the whole
//! matrix under several seeds is `cargo xtask chaos --matrix --seeds N`.

use e2e::chaos::{self, ChaosConfig, LayerOff};

/// This test run's share of the catch matrix: [`LayerOff::SHARE`] switches
/// chosen by the run's seed, each caught on a valid run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_runs_share_of_the_catch_matrix() {
    let seed = crate::chaos::seed();
    let share = LayerOff::share(seed);
    println!(
        "the catch matrix's share of seed {seed}: {:?}",
        share.iter().map(|l| l.name()).collect::<Vec<_>>()
    );
    for layer in share {
        must_catch(layer).await;
    }
}

async fn must_catch(layer: LayerOff) {
    let _slot = crate::exclusive().await;
    let mut cfg = ChaosConfig::ci(crate::chaos::seed());
    cfg.layer_off = Some(layer);
    println!(
        "{} off: seed {} — replay with `cargo xtask chaos --seed {} --layer-off {}` (or CHAOS_SEED={} for this test)",
        layer.name(),
        cfg.seed,
        cfg.seed,
        layer.name(),
        cfg.seed
    );
    // The report (and its picture) kept under target/ for a look afterwards.
    cfg.report_dir = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/chaos")
            .join(format!("layer-off-{}", layer.name())),
    );
    let report = chaos::run(&cfg).await.expect("chaos run completes");
    println!("{}", chaos::markdown(&report));
    // The ordinary schedule, whole: every fault kind and crash point fired.
    assert!(
        report.valid(),
        "{} off (seed {}): not a valid run: {:?}",
        layer.name(),
        cfg.seed,
        report.invalid
    );
    let e = layer.expected();
    assert_eq!(
        report.caught(),
        Some(true),
        "{} off (seed {}): expected \"{}\" to break, shown by {} ({}); broken: {:?}; problems: {:?}",
        layer.name(),
        cfg.seed,
        e.invariant,
        e.effect,
        e.why,
        report.broken(),
        report.problems
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn without_the_http_key_a_retry_makes_a_second_order() {
    must_catch(LayerOff::HttpKey).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn with_event_ids_minted_at_publish_a_republished_row_is_applied_again() {
    must_catch(LayerOff::EventIdAtPublish).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn without_the_order_saga_inbox_redelivered_replies_reach_the_state_machine() {
    must_catch(LayerOff::OrderSagaInbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn without_the_inventory_inbox_redelivered_commands_reach_the_reservation() {
    must_catch(LayerOff::InventoryInbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn without_the_payment_inbox_redelivered_commands_reach_the_payment() {
    must_catch(LayerOff::PaymentInbox).await;
}

/// The seeds' core rule: the inbox row and the effect commit in one
/// transaction. Committed apart, the suite's crash inside the effect's
/// transaction leaves the event "processed" with no effect: the redelivery
/// and every deadline re-send are absorbed, and the order never gets its
/// reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn with_the_inbox_row_committed_before_the_effect_a_crash_between_them_loses_the_effect() {
    must_catch(LayerOff::InboxSeparateTx).await;
}

/// Acknowledge before processing: the suite's crash inside the handler's
/// transaction loses the batch. A later copy (the reconciler's re-send, an
/// injected duplicate) may still finish the order — the audit reads which
/// copy each inbox applied and fails the run for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn with_offsets_committed_before_handling_a_crash_loses_messages_even_with_the_reconciler_on() {
    must_catch(LayerOff::OffsetBeforeHandling).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn without_the_gateway_key_a_retried_charge_charges_again() {
    must_catch(LayerOff::GatewayKey).await;
}

/// The dual write the outbox exists to prevent: the order commits, its
/// command is written after, in a transaction of its own. The suite's crash
/// after the order's commit falls between the two; the deadline's re-send
/// then writes the command for the first time — a loss before the log,
/// which the audit tells from lateness by the log and the outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn with_the_command_written_after_the_order_commits_a_crash_between_loses_it_before_the_log() {
    must_catch(LayerOff::OutboxAfterCommit).await;
}

/// A relay that marks rows it never delivered: the re-sends finish the
/// orders, and the audit holds every mark against the broker's append time
/// of the row's first copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the catch matrix: the test command runs a share (layers::this_runs_share_of_the_catch_matrix); all: -- --ignored layers::"]
async fn with_the_relay_marking_rows_it_never_sent_the_audit_finds_marks_before_the_log() {
    must_catch(LayerOff::RelayMarksUnsent).await;
}
