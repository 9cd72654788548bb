//! The transactional outbox: layer 2 of DESIGN.md.
//!
//! A service never publishes from a request or message handler. It calls
//! [`enqueue`] with the transaction that carries its state change, so the
//! event exists if and only if the change committed. The [`relay`] later
//! publishes pending rows and marks them; a crash between publish and mark
//! publishes the row again, with the same `event_id`, and the consumers'
//! inbox absorbs it.

pub mod relay;

use messaging::{Envelope, Message};
use sqlx::migrate::Migrator;
use sqlx::PgConnection;
use uuid::Uuid;

pub use relay::{KafkaPublisher, PublishError, Publisher, Relay};

/// Errors of the outbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The outbox table's migrations (versions 1001xxxxxx).
pub fn migrator() -> Migrator {
    sqlx::migrate!("./migrations")
}

/// Inserts `envelope` for `topic` in the caller's transaction.
///
/// The `event_id` inside the envelope is the one every publish of this row
/// will carry, however often the relay retries.
pub async fn enqueue(conn: &mut PgConnection, topic: &str, envelope: &Envelope) -> Result<()> {
    sqlx::query(
        "INSERT INTO outbox (event_id, topic, message_key, envelope, event_type, traceparent)
         VALUES ($1, $2, $3, $4::json, $5, $6)",
    )
    .bind(envelope.event_id)
    .bind(topic)
    .bind(envelope.order_id.to_string())
    .bind(serde_json::to_string(envelope).expect("envelope serialises"))
    .bind(&envelope.event_type)
    .bind(envelope.traceparent.as_deref())
    .execute(conn)
    .await?;
    Ok(())
}

/// Builds the envelope for `message` (caused by `cause`) and enqueues it on
/// the message's topic. Returns the new envelope.
pub async fn emit(
    conn: &mut PgConnection,
    order_id: Uuid,
    message: &Message,
    cause: Option<&Envelope>,
) -> Result<Envelope> {
    let envelope = Envelope::new(order_id, message, cause);
    enqueue(conn, message.topic(), &envelope).await?;
    Ok(envelope)
}
