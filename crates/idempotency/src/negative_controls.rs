//! NEGATIVE CONTROL ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the
//! Idempotency-Key layer broken on purpose — a key that names nothing, so
//! that a retry is a new request — so that the chaos suite can show it
//! notices. Chosen once, at a process's start; the extractor
//! ([`crate::http::Idempotent`]) hands its key to `key`, compiled only
//! with the feature. Built without it, this module does not exist and the
//! layer cannot be turned off.

use std::sync::atomic::{AtomicBool, Ordering};

static OFF: AtomicBool = AtomicBool::new(false);

/// From now on every request gets a key of its own: a retry is a new request.
pub fn turn_off() {
    OFF.store(true, Ordering::SeqCst);
}

/// The key a request is stored under: the client's, or — switched off — a
/// fresh one.
pub(crate) fn key(client_key: String) -> String {
    if OFF.load(Ordering::Relaxed) {
        uuid::Uuid::new_v4().to_string()
    } else {
        client_key
    }
}
