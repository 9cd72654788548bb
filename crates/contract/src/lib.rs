//! The saga's protocol, in one place: what a reader needs to know to talk
//! to any service of this system over Kafka.
//!
//! - [`topics`]: the topics, and which consumer reads which;
//! - [`message`]: the commands from the order saga and the participants'
//!   replies, each with the topic it travels on;
//! - [`producers`]: which service may send which message, on which topic;
//! - [`repeats`]: what a repeat of each message gets from its consumer;
//! - [`envelope`]: the envelope every message travels in — identity
//!   (`event_id`), causality (`correlation_id`, `causation_id`) and the W3C
//!   trace context of the span that wrote it.
//!
//! No I/O lives here: the Kafka plumbing is the `kafka` crate, the tables
//! that make delivery effectively-once are `outbox` and `inbox`.

pub mod envelope;
pub mod message;
pub mod producers;
pub mod repeats;
pub mod schema;
pub mod topics;

pub use envelope::Envelope;
pub use message::Message;

/// A message body that is not a valid envelope or payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The bytes or the payload do not decode.
    #[error("decode: {0}")]
    Decode(String),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
