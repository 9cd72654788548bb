//! The order saga: the state machine ([`transitions`]) and the consumer
//! handler that applies replies from inventory and payment to it.
//!
//! Each reply is applied in one transaction: inbox row, order update,
//! history entry and the next command's outbox row. A redelivered reply
//! hits the inbox; a reply that is not legal in the order's current state
//! (stale, reordered, or a second reply with a new event id) is recorded as
//! ignored and counted, never applied.

pub mod transitions;

use contract::topics::consumers::ORDER_SAGA;
use contract::Envelope;
use kafka::consumer::{HandleError, Handled};
use sqlx::PgPool;

use crate::orders::{self, Order};
pub use transitions::{decide, Decision, Input};

/// Why applying a saga step failed: the database did (retry later).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The outbox insert failed.
    #[error("outbox: {0}")]
    Outbox(#[from] outbox::Error),
}

/// Handles one reply event for the saga.
#[tracing::instrument(skip_all, fields(order_id = %envelope.order_id, event_type = %envelope.event_type, event_id = %envelope.event_id))]
pub async fn handle(pool: &PgPool, envelope: Envelope) -> Result<Handled, HandleError> {
    let message = envelope.message().map_err(HandleError::permanent)?;
    let Some(mut tx) = inbox::begin(pool, ORDER_SAGA.name, envelope.event_id)
        .await
        .map_err(HandleError::transient)?
    else {
        return Ok(Handled::Duplicate);
    };
    let Some(order) = orders::lock(&mut tx, envelope.order_id)
        .await
        .map_err(HandleError::transient)?
    else {
        // Not retriable: an order id we never created. The inbox row commits so
        // a redelivery is absorbed; the dead-letter topic gets nothing to replay.
        tracing::warn!("reply for unknown order ignored");
        telemetry::metrics::incr("saga_unknown_order_total", &[]);
        tx.commit().await.map_err(HandleError::transient)?;
        return Ok(Handled::Applied);
    };
    apply(&mut tx, &order, Input::Reply(&message), Some(&envelope))
        .await
        .map_err(HandleError::transient)?;
    tx.commit().await.map_err(HandleError::transient)?;
    Ok(Handled::Applied)
}

/// Applies `input` to `order` (locked by the caller) inside the caller's
/// transaction: status, history, outbox rows. Returns whether it was legal.
pub async fn apply(
    conn: &mut sqlx::PgConnection,
    order: &Order,
    input: Input<'_>,
    cause: Option<&Envelope>,
) -> Result<bool, Error> {
    let event_type = input.name();
    let event_id = cause.map(|c| c.event_id);
    match decide(order, input) {
        Decision::Ignore => {
            tracing::info!(status = order.status.as_str(), "illegal or stale transition ignored");
            telemetry::metrics::incr(
                "saga_ignored_transitions_total",
                &[("status", order.status.as_str()), ("event_type", &event_type)],
            );
            orders::record_history(
                conn,
                order.id,
                Some(order.status),
                order.status,
                &event_type,
                event_id,
                false,
            )
            .await?;
            Ok(false)
        }
        Decision::Apply {
            to,
            emit,
            cancel_reason,
        } => {
            orders::set_status(conn, order.id, to, cancel_reason).await?;
            orders::record_history(conn, order.id, Some(order.status), to, &event_type, event_id, true).await?;
            for next in &emit {
                service_kit::saga::emit(conn, order.id, next, cause).await?;
            }
            telemetry::metrics::incr(
                "saga_transitions_total",
                &[("from", order.status.as_str()), ("to", to.as_str())],
            );
            tracing::info!(from = order.status.as_str(), to = to.as_str(), "saga transition");
            Ok(true)
        }
    }
}
