//! The event envelope (docs/design.md, "Event envelope").
//!
//! Identity rule: two messages with the same `event_id` are one event; two
//! with different ids are two events even if their payloads are equal. The id
//! is assigned once, when the producing service writes its outbox row, and
//! never changes on republish or redelivery.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::message::Message;
use crate::{Error, Result};

/// The envelope's schema version this code writes: `MAJOR.MINOR`. A reader
/// accepts any minor of its major (a minor only adds optional fields, which
/// it ignores) and refuses another major.
pub const VERSION: &str = "1.1";
/// The major version this code reads.
pub const MAJOR: u32 = 1;

fn version_1_0() -> String {
    "1.0".into()
}

/// One event or command on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Envelope {
    /// Schema version of the envelope and its payload, `MAJOR.MINOR`
    /// ([`VERSION`]); absent in messages written before it existed, which
    /// are 1.0.
    #[serde(default = "version_1_0")]
    pub version: String,
    /// Stable identity of this business fact: a UUIDv7 minted once, by the
    /// service that records the fact, and carried unchanged by every copy.
    /// Unique across the whole system — not per topic, per order or per
    /// producer — so a reader needs no other field to recognise a copy
    /// (each inbox keys by consumer and event id).
    pub event_id: Uuid,
    /// The message type, e.g. `ReserveStock`.
    pub event_type: String,
    /// When the fact happened (outbox insert time).
    pub occurred_at: DateTime<Utc>,
    /// The aggregate, also the Kafka message key.
    pub order_id: Uuid,
    /// Shared by every message of one saga instance.
    pub correlation_id: Uuid,
    /// The event that caused this one, if any.
    pub causation_id: Option<Uuid>,
    /// W3C trace context (`traceparent`) of the span that wrote the event,
    /// set by the emitting service (`saga_kit::emit::emit`); the Kafka
    /// headers carry the relay's publish span, a child of it.
    pub traceparent: Option<String>,
    /// The type-specific body.
    pub payload: serde_json::Value,
}

impl Envelope {
    /// A new event for `order_id`, with a fresh `event_id`, caused by `cause`
    /// (whose correlation id it continues) or starting a new saga. No trace
    /// context: the emitter sets the one of its current span.
    pub fn new(order_id: Uuid, message: &Message, cause: Option<&Envelope>) -> Self {
        let (event_type, payload) = message.to_parts();
        Self {
            version: VERSION.into(),
            event_id: Uuid::now_v7(),
            event_type,
            occurred_at: Utc::now(),
            order_id,
            correlation_id: cause.map_or(order_id, |c| c.correlation_id),
            causation_id: cause.map(|c| c.event_id),
            traceparent: None,
            payload,
        }
    }

    /// Parses an envelope from a Kafka message body.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::Decode(format!("envelope: {e}")))
    }

    /// The fact this envelope states, as 64 bits: a digest of its type,
    /// its order and its payload (keys sorted) — not of what may differ
    /// between honest copies of one event (its version's minor, its time,
    /// its trace context). Two copies of one event have the same; an id
    /// used again for another fact almost surely has not. An inbox keeps
    /// it with the id, so a reuse is caught instead of absorbed.
    pub fn fingerprint(&self) -> i64 {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update(self.event_type.as_bytes());
        hash.update([0]);
        hash.update(self.order_id.as_bytes());
        hash.update(serde_json::to_vec(&self.payload).expect("a JSON value serialises"));
        let digest = hash.finalize();
        i64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 digest has 8 bytes"))
    }

    /// Serialises the envelope as the Kafka message body.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("envelope serialises")
    }

    /// Decodes the typed message carried by this envelope. Another major
    /// version, an unknown event type or a payload that does not fit its
    /// type is a decode error naming the reason (the consumer dead-letters it).
    pub fn message(&self) -> Result<Message> {
        let major = self.version.split('.').next().and_then(|m| m.parse::<u32>().ok());
        if major != Some(MAJOR) {
            return Err(Error::Decode(format!(
                "envelope version {:?} is not readable here: this consumer reads {MAJOR}.x",
                self.version
            )));
        }
        Message::from_parts(&self.event_type, self.payload.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy (another time, trace, minor version; keys reordered) has its
    /// event's fingerprint; another type, order or payload has not.
    #[test]
    fn a_copy_keeps_the_fingerprint_another_fact_changes_it() {
        let order = Uuid::new_v4();
        let message = Message::ReserveStock {
            sku: "A".into(),
            quantity: 2,
        };
        let event = Envelope::new(order, &message, None);
        let mut copy = Envelope::from_bytes(&event.to_bytes()).unwrap();
        copy.occurred_at = Utc::now() + chrono::Duration::seconds(5);
        copy.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        copy.version = "1.0".into();
        let reordered: serde_json::Value = serde_json::from_str(r#"{"quantity":2,"sku":"A"}"#).unwrap();
        copy.payload = reordered;
        assert_eq!(copy.fingerprint(), event.fingerprint());
        let mut other = event.clone();
        other.payload = serde_json::json!({"sku": "A", "quantity": 3});
        assert_ne!(other.fingerprint(), event.fingerprint(), "another payload");
        let mut other = event.clone();
        other.event_type = "ReleaseStock".into();
        assert_ne!(other.fingerprint(), event.fingerprint(), "another type");
        let mut other = event.clone();
        other.order_id = Uuid::new_v4();
        assert_ne!(other.fingerprint(), event.fingerprint(), "another order");
    }

    #[test]
    fn round_trip_keeps_identity_and_causality() {
        let order = Uuid::new_v4();
        let first = Envelope::new(
            order,
            &Message::ReserveStock {
                sku: "A".into(),
                quantity: 2,
            },
            None,
        );
        let reply = Envelope::new(order, &Message::StockReserved, Some(&first));
        let decoded = Envelope::from_bytes(&reply.to_bytes()).unwrap();
        assert_eq!(decoded, reply);
        assert_eq!(decoded.causation_id, Some(first.event_id));
        assert_eq!(decoded.correlation_id, first.correlation_id);
        assert_ne!(decoded.event_id, first.event_id);
        assert_eq!(decoded.message().unwrap(), Message::StockReserved);
    }

    #[test]
    fn the_next_minor_is_read_and_another_major_is_refused_with_its_reason() {
        let order = Uuid::new_v4();
        let mut v = serde_json::to_value(Envelope::new(order, &Message::StockReserved, None)).unwrap();
        assert_eq!(v["version"], VERSION);
        // 1.9 adds an optional field: read, the field ignored.
        v["version"] = "1.9".into();
        v["priority"] = "high".into();
        let next = Envelope::from_bytes(v.to_string().as_bytes()).unwrap();
        assert_eq!(next.message().unwrap(), Message::StockReserved);
        // 2.0: refused, and the reason says why.
        v["version"] = "2.0".into();
        let e = Envelope::from_bytes(v.to_string().as_bytes())
            .unwrap()
            .message()
            .unwrap_err();
        assert!(e.to_string().contains("version \"2.0\""), "{e}");
        // Written before the field existed: 1.0.
        v.as_object_mut().unwrap().remove("version");
        let old = Envelope::from_bytes(v.to_string().as_bytes()).unwrap();
        assert_eq!(
            (old.version.as_str(), old.message().unwrap()),
            ("1.0", Message::StockReserved)
        );
        // An unknown type names itself.
        v["event_type"] = "StockTeleported".into();
        let e = Envelope::from_bytes(v.to_string().as_bytes())
            .unwrap()
            .message()
            .unwrap_err();
        assert!(e.to_string().contains("StockTeleported"), "{e}");
    }

    #[test]
    fn garbage_is_a_decode_error() {
        assert!(matches!(Envelope::from_bytes(b"{not json"), Err(Error::Decode(_))));
    }
}
