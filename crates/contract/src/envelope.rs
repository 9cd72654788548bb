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

/// One event or command on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Stable identity of this business fact.
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
    /// set by the emitting service (`service_kit::saga::emit`); the Kafka
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

    /// Serialises the envelope as the Kafka message body.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("envelope serialises")
    }

    /// Decodes the typed message carried by this envelope.
    pub fn message(&self) -> Result<Message> {
        Message::from_parts(&self.event_type, self.payload.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn garbage_is_a_decode_error() {
        assert!(matches!(Envelope::from_bytes(b"{not json"), Err(Error::Decode(_))));
    }
}
