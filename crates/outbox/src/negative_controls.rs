//! NEGATIVE CONTROLS ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the three
//! protections of the publishing side broken on purpose, so that the chaos
//! suite can show it notices. Each is chosen once, at a process's start;
//! the Kafka publisher hands a row's identity (`identity`) and its
//! producer's settings (`producer_settings`) over here, compiled only
//! with the feature. Built without it, this module does not exist.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static MINT: AtomicBool = AtomicBool::new(false);
static NOT_IDEMPOTENT: AtomicBool = AtomicBool::new(false);
static MARK_UNSENT: AtomicBool = AtomicBool::new(false);
static ROWS: AtomicU64 = AtomicU64::new(0);

/// Under [`marks_unsent`], one row in this many is reported delivered
/// without being sent.
pub const UNSENT_EVERY: u64 = 20;

/// From now on the Kafka publisher mints a new event id at every publish
/// instead of sending the one the row was given: a row published again (a
/// relay crash between the broker's ack and the mark) is a new event to
/// every inbox.
pub fn event_id_at_publish() {
    MINT.store(true, Ordering::SeqCst);
}

/// From now on `kafka::idempotent_producer` builds producers without
/// `enable.idempotence`: a batch retried after a lost acknowledgement is
/// appended again.
pub fn no_producer_idempotence() {
    NOT_IDEMPOTENT.store(true, Ordering::SeqCst);
}

/// From now on the Kafka publisher reports every [`UNSENT_EVERY`]th row
/// as acknowledged without sending it, and the relay marks it published:
/// a loss before the log (a relay that does not await its deliveries, or
/// treats a failed one as done). Nothing downstream ever sees the row —
/// unless a deadline's re-send puts it in the log later, as its first copy.
pub fn marks_unsent() {
    MARK_UNSENT.store(true, Ordering::SeqCst);
}

/// Whether the row about to be published is one to leave unsent (counted
/// over every row this process publishes).
#[cfg(feature = "kafka")]
pub(crate) fn leave_unsent() -> bool {
    MARK_UNSENT.load(Ordering::Relaxed) && ROWS.fetch_add(1, Ordering::Relaxed) % UNSENT_EVERY == UNSENT_EVERY - 1
}

/// The identity a row is published under: its own — or, minting at
/// publish, a fresh id, written into the body too.
#[cfg(feature = "kafka")]
pub(crate) fn identity(event_id: String, body: String) -> (String, String) {
    if !MINT.load(Ordering::Relaxed) {
        return (event_id, body);
    }
    minted(&body)
}

#[cfg(feature = "kafka")]
fn minted(body: &str) -> (String, String) {
    let id = uuid::Uuid::now_v7().to_string();
    let mut value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("event_id".into(), serde_json::Value::String(id.clone()));
    }
    (id, value.to_string())
}

/// The producer's settings: idempotence off when so chosen.
#[cfg(feature = "kafka")]
pub(crate) fn producer_settings(config: &mut rdkafka::ClientConfig) {
    if NOT_IDEMPOTENT.load(Ordering::Relaxed) {
        config.set("enable.idempotence", "false");
    }
}

#[cfg(all(test, feature = "kafka"))]
mod tests {
    #[test]
    fn minting_at_publish_writes_a_new_id_into_the_body() {
        let (id, body) = super::minted(r#"{"event_id":"first","payload":1}"#);
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_ne!(id, "first");
        assert_eq!(value["event_id"], id.as_str());
        assert_eq!(value["payload"], 1, "the rest of the body kept");
    }
}
