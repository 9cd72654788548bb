//! Messaging contract and Kafka wiring.
//!
//! - [`envelope`]: the event envelope every message travels in (DESIGN.md
//!   "Event envelope"): identity (`event_id`), causality and trace context.
//! - [`message`]: the saga's commands and replies, and which topic each uses.
//! - [`kafka`]: client configuration, the idempotent producer, topic creation.
//! - [`consumer`]: the consume loop — decode, hand to an inbox-backed handler,
//!   commit the offset only after the handler's transaction, dead-letter what
//!   can never succeed.

pub mod consumer;
pub mod dlq;
pub mod envelope;
pub mod kafka;
pub mod message;

pub use envelope::Envelope;
pub use message::Message;

/// Errors of the messaging layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The broker or librdkafka reported an error.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A message body is not a valid envelope or payload.
    #[error("decode: {0}")]
    Decode(String),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
