//! NEGATIVE CONTROLS ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the two ways
//! to break the inbox on purpose, so that the chaos suite can show it
//! notices. Each is set once, at a process's start, and stays set. Built
//! without the feature, this module does not exist and the inbox cannot be
//! switched off.

use std::sync::atomic::{AtomicBool, Ordering};

static OFF: AtomicBool = AtomicBool::new(false);
static APART: AtomicBool = AtomicBool::new(false);

/// The inbox records nothing and reports every delivery as new.
pub fn turn_off() {
    OFF.store(true, Ordering::SeqCst);
}

/// [`crate::begin_batch`] commits the inbox rows in their own transaction,
/// before the effects they stand for, and returns a new one for the effects.
pub fn commit_apart() {
    APART.store(true, Ordering::SeqCst);
}

pub(crate) fn off() -> bool {
    OFF.load(Ordering::Relaxed)
}

pub(crate) fn apart() -> bool {
    APART.load(Ordering::Relaxed)
}
