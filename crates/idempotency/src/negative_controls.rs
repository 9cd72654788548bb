//! NEGATIVE CONTROL ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the
//! Idempotency-Key layer switched off on purpose, so that the chaos suite
//! can show it notices. Set once, at a process's start. Built without the
//! feature, this module does not exist and the layer cannot be turned off.

use std::sync::atomic::{AtomicBool, Ordering};

static OFF: AtomicBool = AtomicBool::new(false);

/// Every request gets a key of its own: a retry is a new request.
pub fn turn_off() {
    OFF.store(true, Ordering::SeqCst);
}

pub(crate) fn off() -> bool {
    OFF.load(Ordering::Relaxed)
}
