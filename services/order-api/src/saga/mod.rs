//! The order saga: the state machine ([`transitions`]) and the consumer
//! handler that applies replies from inventory and payment to it.
//!
//! Each reply is applied in one transaction: inbox row, order update,
//! history entry and the next command's outbox row. A redelivered reply
//! hits the inbox; a reply that is not legal in the order's current state
//! (stale, reordered, or a second reply with a new event id) is recorded as
//! ignored and counted, never applied.

pub mod reconcile;
pub mod transitions;

use contract::topics::consumers::ORDER_SAGA;
use contract::Envelope;
use kafka::consumer::{HandleError, Handled, Traced};
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
pub async fn handle(pool: &PgPool, envelope: Envelope) -> Result<Handled, HandleError> {
    saga_kit::consumer::handle_one(envelope, |one| handle_batch(pool, one)).await
}

/// Handles a partition's queued replies, in order, in one transaction: one
/// multi-row inbox insert, then each new reply applied to its order. All
/// commit together or none does (the consumer then retries, or handles the
/// envelopes one by one to isolate one that can never apply).
pub async fn handle_batch(pool: &PgPool, batch: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, HandleError> {
    let messages = batch
        .iter()
        .map(|t| t.message.message())
        .collect::<Result<Vec<_>, _>>()
        .map_err(HandleError::permanent)?;
    saga_kit::consumer::apply_batch(
        pool,
        ORDER_SAGA.name,
        &batch,
        &messages,
        |_, _| Box::pin(async { Ok::<_, Error>(()) }),
        |conn, envelope, messages, i| Box::pin(apply_reply(conn, envelope, &messages[i])),
    )
    .await
}

/// Applies one new reply to its order inside the batch's transaction.
#[tracing::instrument(skip_all, fields(order_id = %envelope.order_id, event_type = %envelope.event_type, event_id = %envelope.event_id))]
async fn apply_reply(
    conn: &mut sqlx::PgConnection,
    envelope: &Envelope,
    message: &contract::Message,
) -> Result<(), Error> {
    let Some(order) = orders::lock(conn, envelope.order_id).await? else {
        // Not retriable: an order id we never created. The inbox row commits so
        // a redelivery is absorbed; the dead-letter topic gets nothing to replay.
        tracing::warn!("reply for unknown order ignored");
        telemetry::metrics::incr("saga_unknown_order_total", &[]);
        return Ok(());
    };
    apply(conn, &order, Input::Reply(message), Some(envelope)).await?;
    Ok(())
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
            match (event_id, order.reconciled_at) {
                // A reply new to the inbox that the state machine had to stop.
                (Some(event_id), None) => {
                    inbox::note_miss(conn, ORDER_SAGA.name, event_id, order.id, "saga state machine").await?
                }
                // The participant's reply, arriving after reconciliation took
                // the gateway's answer for it: expected, not a miss.
                (Some(_), Some(_)) => telemetry::metrics::incr("saga_replies_after_reconciliation_total", &[]),
                (None, _) => {}
            }
            Ok(false)
        }
        Decision::Apply {
            to,
            emit,
            cancel_reason,
        } => {
            // The command the new state waits on (at most one per transition).
            let mut command = None;
            for next in &emit {
                command = Some(saga_kit::emit::emit(conn, order.id, next, cause).await?.event_id);
            }
            orders::set_status(conn, order.id, to, cancel_reason, command).await?;
            orders::record_history(conn, order.id, Some(order.status), to, &event_type, event_id, true).await?;
            if matches!(input, Input::Reconciled(_)) {
                orders::mark_reconciled(conn, order.id).await?;
            }
            telemetry::metrics::incr(
                "saga_transitions_total",
                &[("from", order.status.as_str()), ("to", to.as_str())],
            );
            if matches!(
                to,
                orders::Status::Confirmed | orders::Status::Cancelled | orders::Status::ManualReview
            ) {
                let took = (chrono::Utc::now() - order.created_at).to_std().unwrap_or_default();
                telemetry::metrics::observe("saga_duration_seconds", &[("status", to.as_str())], took);
            }
            tracing::info!(from = order.status.as_str(), to = to.as_str(), "saga transition");
            Ok(true)
        }
    }
}
