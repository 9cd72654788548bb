//! NEGATIVE CONTROL ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): a consumer
//! that acknowledges before it processes, swapped in on purpose so that the
//! chaos suite can show it notices. Chosen once, at a process's start; each
//! lane hands its batch to `before_handling` before handling it, compiled
//! only with the feature. Built without it, this module does not exist and
//! nothing here can be turned on.

use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::{Message as _, OwnedMessage};

use crate::group::GroupConsumer;

static ACK_FIRST: AtomicBool = AtomicBool::new(false);

/// From now on each batch's offsets are committed before its handler runs
/// (acknowledging before processing): a crash mid-handling loses the batch.
pub fn ack_first() {
    ACK_FIRST.store(true, Ordering::SeqCst);
}

/// Acknowledging first: the batch's last offset stored and committed
/// before any of it is handled, as a consumer that commits at receipt does.
/// Otherwise nothing.
pub(crate) fn before_handling(consumer: &GroupConsumer, name: &str, batch: &[OwnedMessage]) {
    if !ACK_FIRST.load(Ordering::Relaxed) {
        return;
    }
    let last = batch.last().expect("a batch has a message");
    let acked = consumer
        .store_offset(last.topic(), last.partition(), last.offset())
        .and_then(|()| consumer.commit_consumer_state(CommitMode::Sync));
    if let Err(e) = acked {
        tracing::warn!(consumer = name, error = %e, "offset commit before handling failed");
    }
}
