//! NEGATIVE CONTROLS ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the two
//! protections of the publishing side broken on purpose, so that the chaos
//! suite can show it notices. Each is set once, at a process's start. Built
//! without the feature, this module does not exist.

use std::sync::atomic::{AtomicBool, Ordering};

static MINT: AtomicBool = AtomicBool::new(false);
static NOT_IDEMPOTENT: AtomicBool = AtomicBool::new(false);

/// The Kafka publisher mints a new event id at every publish instead of
/// sending the one the row was given: a row published again (a relay crash
/// between the broker's ack and the mark) is a new event to every inbox.
pub fn event_id_at_publish() {
    MINT.store(true, Ordering::SeqCst);
}

/// [`crate::kafka::idempotent_producer`] builds producers without
/// `enable.idempotence`: a batch retried after a lost acknowledgement is
/// appended again.
pub fn no_producer_idempotence() {
    NOT_IDEMPOTENT.store(true, Ordering::SeqCst);
}

pub(crate) fn mints() -> bool {
    MINT.load(Ordering::Relaxed)
}

pub(crate) fn producer_not_idempotent() -> bool {
    NOT_IDEMPOTENT.load(Ordering::Relaxed)
}
