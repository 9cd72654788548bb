//! NEGATIVE CONTROL ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the consumer's
//! acknowledgement after handling switched off on purpose, so that the chaos suite can
//! show it notices. Set once, at a process's start. Built without
//! the feature, this module does not exist and nothing here can be turned off.

use std::sync::atomic::{AtomicBool, Ordering};

static ACK_FIRST: AtomicBool = AtomicBool::new(false);

/// Each batch's offsets are committed before its handler runs
/// (acknowledging before processing): a crash mid-handling loses the batch.
pub fn ack_first() {
    ACK_FIRST.store(true, Ordering::SeqCst);
}

pub(crate) fn acks_first() -> bool {
    ACK_FIRST.load(Ordering::Relaxed)
}
