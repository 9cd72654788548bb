//! Scenario 18's negative control, in a process of its own: the switch it
//! turns on (`UNSAFE_NO_PRODUCER_IDEMPOTENCE`, `outbox::negative_controls`)
//! holds for the whole process,
//! and the relay tests beside it (`tests/relay/main.rs`) run with every
//! layer on. Built only with failpoints (the relay's lost-ack point exists only there).
#![cfg(feature = "failpoints")]

// The relay tests' helpers; this process needs some of them.
#[allow(dead_code)]
mod common;
mod lost_ack;

/// The negative control: the same lost acknowledgement without idempotence
/// leaves the batch twice in the log — so the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_producer_idempotence_the_retried_batch_is_appended_twice() {
    outbox::negative_controls::no_producer_idempotence();
    let outcome = lost_ack::lost_ack_round().await;
    assert!(outcome.swallowed > 0, "the acknowledgement was really lost");
    let doubled = outcome.copies.values().filter(|n| **n > 1).count();
    assert!(
        doubled > 0,
        "no duplicate without idempotence: the lost-ack test proves nothing ({:?})",
        outcome.copies.values().collect::<Vec<_>>()
    );
    eprintln!("without idempotence: {doubled} of 21 events twice in the log");
}
