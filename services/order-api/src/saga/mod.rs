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
use std::collections::HashMap;

use contract::{Envelope, Message};
use kafka::consumer::{HandleError, Handled, Traced};
use sqlx::PgPool;
use uuid::Uuid;

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

/// Fault point (failpoints builds): dead-letter the first delivery of each
/// reply whose type its argument names
/// (`order_api::dead_letter_reply=return(StockReserved)`) — a reply lost
/// after it was sent. The saga's deadline re-sends the command under its
/// first id, and the participant answers again with the same reply (the
/// replies its inbox kept), which is then handled.
pub const DEAD_LETTER_REPLY: &str = "order_api::dead_letter_reply";

/// Refuses a batch holding a reply picked by [`DEAD_LETTER_REPLY`].
fn injected_loss(batch: &[Traced<Envelope>]) -> Result<(), HandleError> {
    static FAULTS: saga_kit::inject::DeadLetter = saga_kit::inject::DeadLetter::new();
    for item in batch {
        let envelope = &item.message;
        if FAULTS.refuses(envelope.event_id, batch.len() == 1, || named(&envelope.event_type)) {
            return Err(HandleError::permanent(format!("injected: {DEAD_LETTER_REPLY}")));
        }
    }
    Ok(())
}

/// Whether [`DEAD_LETTER_REPLY`] names `event_type`.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
fn named(event_type: &str) -> bool {
    fail::fail_point!(DEAD_LETTER_REPLY, |named: Option<String>| named.as_deref()
        == Some(event_type));
    false
}

/// Handles one reply event for the saga.
pub async fn handle(pool: &PgPool, envelope: Envelope) -> Result<Handled, HandleError> {
    saga_kit::consumer::handle_one(envelope, |one| handle_batch(pool, one)).await
}

/// Handles a partition's queued replies, in order, in one transaction and a
/// fixed handful of statements: one multi-row inbox insert, the batch's
/// orders locked and read in one, then each new reply decided in order
/// against its order in memory (`Plan::step`) and the result written in
/// two statements (`Plan::write`). All commit together or none
/// does (the consumer then retries, or handles the envelopes one by one to
/// isolate one that can never apply).
pub async fn handle_batch(pool: &PgPool, batch: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, HandleError> {
    if cfg!(feature = "failpoints") {
        injected_loss(&batch)?;
    }
    let messages = batch
        .iter()
        .map(|t| t.message.message())
        .collect::<Result<Vec<_>, _>>()
        .map_err(HandleError::permanent)?;
    let (mut tx, fresh) = saga_kit::consumer::begin(pool, ORDER_SAGA.name, &batch).await?;
    let ignored = if fresh.is_empty() {
        Vec::new()
    } else {
        advance_with_replies(&mut tx, &batch, &messages, &fresh.indices())
            .await
            .map_err(saga_kit::consumer::classify)?
    };
    let mut outcomes = saga_kit::consumer::commit(tx, &fresh).await?;
    for i in ignored {
        outcomes[i] = Handled::Ignored;
    }
    Ok(outcomes)
}

/// Advances the orders of the new replies (`fresh` indices of `batch`)
/// inside the batch's transaction. Returns the indices of those the state
/// machine stopped (or whose order does not exist): new to the inbox,
/// nothing applied.
async fn advance_with_replies(
    conn: &mut sqlx::PgConnection,
    batch: &[Traced<Envelope>],
    messages: &[Message],
    fresh: &[usize],
) -> Result<Vec<usize>, Error> {
    let ids: Vec<Uuid> = fresh.iter().map(|&i| batch[i].message.order_id).collect();
    let mut locked: HashMap<Uuid, Order> = orders::lock_all(conn, &ids)
        .await?
        .into_iter()
        .map(|o| (o.id, o))
        .collect();
    let mut plan = Plan::default();
    let mut ignored = Vec::new();
    for &i in fresh {
        let Traced {
            message: envelope,
            span,
            ..
        } = &batch[i];
        let Some(order) = locked.get_mut(&envelope.order_id) else {
            // Not retriable: an order id we never created. The inbox row commits so
            // a redelivery is absorbed; the dead-letter topic gets nothing to replay.
            span.in_scope(|| tracing::warn!("reply for unknown order ignored"));
            telemetry::metrics::incr("saga_unknown_order_total", &[]);
            ignored.push(i);
            continue;
        };
        if !plan.step(order, Input::Reply(&messages[i]), Some(envelope), span) {
            ignored.push(i);
        }
    }
    plan.write(conn).await?;
    Ok(ignored)
}

/// Advances `order` (locked by the caller) by `input` inside the caller's
/// transaction: status, history, outbox rows. Returns whether it was legal.
pub async fn advance(
    conn: &mut sqlx::PgConnection,
    order: &Order,
    input: Input<'_>,
    cause: Option<&Envelope>,
) -> Result<bool, Error> {
    let mut plan = Plan::default();
    let legal = plan.step(&mut order.clone(), input, cause, &tracing::Span::current());
    plan.write(conn).await?;
    Ok(legal)
}

/// What a run of saga inputs writes, gathered to be written together.
#[derive(Debug, Default)]
struct Plan {
    /// The commands to send, in order.
    commands: Vec<(Message, Envelope)>,
    /// The last transition of each order moved.
    moves: Vec<orders::Transition>,
    history: Vec<orders::NewHistory>,
    /// Replies new to the inbox that the state machine stopped: (event, order).
    misses: Vec<(Uuid, Uuid)>,
    reconciled: Vec<Uuid>,
}

impl Plan {
    /// Decides `input` for `order` and notes what that writes; an applied
    /// transition also moves `order` in memory, for the next input about
    /// it. Logs and metrics go to `span`. Returns whether it was legal.
    fn step(&mut self, order: &mut Order, input: Input<'_>, cause: Option<&Envelope>, span: &tracing::Span) -> bool {
        let _entered = span.enter();
        let event_type = input.name();
        let event_id = cause.map(|c| c.event_id);
        let (to, emit, cancel_reason) = match decide(order, input) {
            Decision::Ignore => {
                tracing::info!(status = order.status.as_str(), "illegal or stale transition ignored");
                telemetry::metrics::incr(
                    "saga_ignored_transitions_total",
                    &[("status", order.status.as_str()), ("event_type", &event_type)],
                );
                self.history.push(orders::NewHistory {
                    order_id: order.id,
                    from: Some(order.status),
                    to: order.status,
                    cause: event_type,
                    event_id,
                    applied: false,
                });
                match (event_id, order.reconciled_at) {
                    // A reply new to the inbox that the state machine had to stop.
                    (Some(event_id), None) => self.misses.push((event_id, order.id)),
                    // The participant's reply, arriving after reconciliation took
                    // the gateway's answer for it: expected, not a miss.
                    (Some(_), Some(_)) => telemetry::metrics::incr("saga_replies_after_reconciliation_total", &[]),
                    (None, _) => {}
                }
                return false;
            }
            Decision::Apply {
                to,
                emit,
                cancel_reason,
            } => (to, emit, cancel_reason),
        };
        // The command the new state waits on (at most one per transition).
        let mut command = None;
        for next in emit {
            let envelope = saga_kit::emit::envelope(order.id, &next, cause, span);
            command = Some(envelope.event_id);
            self.commands.push((next, envelope));
        }
        let moved = orders::Transition {
            id: order.id,
            status: to,
            cancel_reason,
            command,
        };
        match self.moves.iter_mut().find(|m| m.id == order.id) {
            Some(earlier) => {
                *earlier = orders::Transition {
                    cancel_reason: cancel_reason.or(earlier.cancel_reason),
                    ..moved
                }
            }
            None => self.moves.push(moved),
        }
        self.history.push(orders::NewHistory {
            order_id: order.id,
            from: Some(order.status),
            to,
            cause: event_type,
            event_id,
            applied: true,
        });
        if matches!(input, Input::Reconciled(_)) {
            self.reconciled.push(order.id);
            order.reconciled_at = Some(chrono::Utc::now());
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
        tracing::debug!(target: telemetry::trace::PER_ORDER, from = order.status.as_str(), to = to.as_str(), "saga transition");
        order.status = to;
        if let Some(reason) = cancel_reason {
            order.cancel_reason = Some(reason.into());
        }
        order.last_command_id = command;
        order.reconcile_attempts = 0;
        true
    }

    /// Writes what the steps noted in one statement ([`orders::write_batch`]):
    /// the orders' new states, the history entries, a confirmed order's
    /// notice (intended in the transaction that confirms it) and the
    /// commands' outbox rows. Rarer writes follow it: reconciliations, misses.
    async fn write(self, conn: &mut sqlx::PgConnection) -> Result<(), Error> {
        let commands: Vec<_> = self
            .commands
            .iter()
            .map(|(message, envelope)| saga_kit::emit::outbox_event(message.topic(), envelope))
            .collect();
        orders::write_batch(conn, &self.moves, &self.history, &commands).await?;
        orders::mark_reconciled(conn, &self.reconciled).await?;
        for (event_id, order_id) in self.misses {
            saga_kit::consumer::note_miss(conn, ORDER_SAGA.name, event_id, order_id, "saga state machine").await?;
        }
        Ok(())
    }
}
