//! NEGATIVE CONTROL ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the outbox's
//! stable event id broken on purpose, so that the chaos suite can show it
//! notices. Set once, at a process's start. Built without the feature, this
//! module does not exist.

use std::sync::atomic::{AtomicBool, Ordering};

static MINT: AtomicBool = AtomicBool::new(false);

/// The Kafka publisher mints a new event id at every publish instead of
/// sending the one the row was given: a row published again (a relay crash
/// between the broker's ack and the mark) is a new event to every inbox.
pub fn event_id_at_publish() {
    MINT.store(true, Ordering::SeqCst);
}

pub(crate) fn mints() -> bool {
    MINT.load(Ordering::Relaxed)
}
