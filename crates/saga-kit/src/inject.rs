//! Injected faults a handler can be told to act out (test builds drive
//! them through fault points; a production build never picks anything).

use std::sync::Mutex;

use uuid::Uuid;

/// A message refused as if it could never be handled, so that the consumer
/// dead-letters it — what a lost message looks like to the saga.
///
/// A batching consumer isolates a refused batch by handling its messages
/// one at a time, and dead-letters the one that fails alone; so a picked
/// event stays refused until it was refused alone. After that, copies of
/// the same event (a re-send under its first id) are handled: the fault is
/// one lost delivery, not a poison message.
#[derive(Debug, Default)]
pub struct DeadLetter {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Picked, not yet refused alone.
    refused: Vec<Uuid>,
    /// Refused alone: dead-lettered, never picked again.
    lost: Vec<Uuid>,
}

impl DeadLetter {
    /// Nothing picked yet.
    pub const fn new() -> Self {
        Self {
            state: Mutex::new(State {
                refused: Vec::new(),
                lost: Vec::new(),
            }),
        }
    }

    /// Whether this delivery of `event_id` is refused: it was picked before
    /// and not yet refused alone, or `pick` picks it now. `alone`: the
    /// delivery is a batch of one.
    pub fn refuses(&self, event_id: Uuid, alone: bool, pick: impl FnOnce() -> bool) -> bool {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.lost.contains(&event_id) {
            return false;
        }
        let picked = state.refused.contains(&event_id) || pick();
        if picked {
            state.refused.retain(|id| *id != event_id);
            if alone {
                state.lost.push(event_id);
            } else {
                state.refused.push(event_id);
            }
        }
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picked_event_is_refused_until_refused_alone_and_its_copies_are_then_handled() {
        let faults = DeadLetter::new();
        let (picked, other) = (Uuid::new_v4(), Uuid::new_v4());
        assert!(!faults.refuses(other, false, || false), "nothing picked");
        assert!(faults.refuses(picked, false, || true), "picked in a batch");
        assert!(faults.refuses(picked, false, || false), "still refused in a batch");
        assert!(faults.refuses(picked, true, || false), "refused alone: dead-lettered");
        assert!(!faults.refuses(picked, true, || true), "its re-send is handled");
        assert!(!faults.refuses(other, true, || false));
    }

    #[test]
    fn an_event_refused_alone_leaves_the_others_picked() {
        let faults = DeadLetter::new();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert!(faults.refuses(a, false, || true));
        assert!(faults.refuses(b, false, || true));
        assert!(faults.refuses(a, true, || false), "a refused alone");
        assert!(faults.refuses(b, false, || false), "b still picked");
    }
}
