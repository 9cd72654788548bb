//! Deadlines per saga state, and what happens when one passes.
//!
//! Every open state waits on one command's reply. When the reply is overdue:
//!
//! - a **payment** state (AWAITING_PAYMENT, REFUNDING) first asks the
//!   gateway what it did under the operation's key. A record is the answer
//!   payment-service would have sent: the order moves exactly as that reply
//!   would move it (`Reconciled:PaymentCaptured` in the history), and the
//!   reply, when it comes, is ignored. No record means no money moved yet;
//! - the state's command is **re-sent under its first event id** (the outbox
//!   row is made pending again). A participant that handled it absorbs the
//!   copy in its inbox; one that never got it (dead-lettered, lost with a
//!   topic) handles it — and the operation's key keeps a charge single;
//! - after `RECONCILE_MAX_RESENDS` re-sends the order goes to MANUAL_REVIEW.
//!
//! Absence at the gateway is never taken as "declined": a command still in
//! flight could charge a moment later, and cancelling then would keep money
//! for a cancelled order. Only a record, or a person, ends a payment state.

use std::time::Duration;

use contract::Message;
use sqlx::PgPool;
use uuid::Uuid;

use crate::gateway;
use crate::orders::{self, Order, Status};
use crate::saga::{advance, Input};

/// Deadlines and the reconciler's pace, from the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct DeadlineArgs {
    /// Seconds an order may wait in PENDING for inventory's reply.
    #[arg(long, env = "SAGA_DEADLINE_PENDING_SECS", default_value_t = 60)]
    pub pending_secs: u64,
    /// Seconds an order may wait in AWAITING_PAYMENT for payment's reply.
    #[arg(long, env = "SAGA_DEADLINE_AWAITING_PAYMENT_SECS", default_value_t = 60)]
    pub awaiting_payment_secs: u64,
    /// Seconds an order may wait in REFUNDING for payment's reply.
    #[arg(long, env = "SAGA_DEADLINE_REFUNDING_SECS", default_value_t = 60)]
    pub refunding_secs: u64,
    /// Seconds an order may wait in CANCELLING for inventory's reply.
    #[arg(long, env = "SAGA_DEADLINE_CANCELLING_SECS", default_value_t = 60)]
    pub cancelling_secs: u64,
    /// Seconds between the reconciler's scans for overdue orders.
    #[arg(long, env = "RECONCILE_INTERVAL_SECS", default_value_t = 5)]
    pub interval_secs: u64,
    /// Re-sends of an overdue state's command before MANUAL_REVIEW.
    #[arg(long, env = "RECONCILE_MAX_RESENDS", default_value_t = 5)]
    pub max_resends: i32,
}

impl Default for DeadlineArgs {
    fn default() -> Self {
        Self {
            pending_secs: 60,
            awaiting_payment_secs: 60,
            refunding_secs: 60,
            cancelling_secs: 60,
            interval_secs: 5,
            max_resends: 5,
        }
    }
}

impl DeadlineArgs {
    /// The deadline of `status` (None: not an open state).
    pub fn deadline(&self, status: Status) -> Option<Duration> {
        let secs = match status {
            Status::Pending => self.pending_secs,
            Status::AwaitingPayment => self.awaiting_payment_secs,
            Status::Refunding => self.refunding_secs,
            Status::Cancelling => self.cancelling_secs,
            _ => return None,
        };
        Some(Duration::from_secs(secs))
    }
}

/// What one scan did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Overdue orders found.
    pub overdue: usize,
    /// Moved by the gateway's record.
    pub reconciled: usize,
    /// Commands re-sent.
    pub resent: usize,
    /// Sent to MANUAL_REVIEW.
    pub manual_review: usize,
    /// Left for the next scan (gateway unavailable, or the order moved meanwhile).
    pub skipped: usize,
}

/// What happened to one overdue order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The gateway's record moved it.
    Reconciled,
    /// Its command was re-sent.
    Resent,
    /// Re-sends exhausted: MANUAL_REVIEW.
    ManualReview,
    /// Nothing done this time.
    Skipped,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Reconciled => "reconciled",
            Outcome::Resent => "resent",
            Outcome::ManualReview => "manual_review",
            Outcome::Skipped => "skipped",
        }
    }
}

/// Scans for overdue orders (up to 200, oldest first) and handles each.
pub async fn tick(pool: &PgPool, gateway: &gateway::Client, args: &DeadlineArgs) -> anyhow::Result<Report> {
    let (review,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders WHERE status = 'MANUAL_REVIEW'")
        .fetch_one(pool)
        .await?;
    telemetry::metrics::set("orders_manual_review", &[], review as f64);
    let overdue: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM orders
         WHERE status IN ('PENDING', 'AWAITING_PAYMENT', 'REFUNDING', 'CANCELLING')
           AND updated_at < now() - make_interval(secs => CASE status
                 WHEN 'PENDING' THEN $1 WHEN 'AWAITING_PAYMENT' THEN $2
                 WHEN 'REFUNDING' THEN $3 ELSE $4 END)
         ORDER BY updated_at LIMIT 200",
    )
    .bind(args.pending_secs as f64)
    .bind(args.awaiting_payment_secs as f64)
    .bind(args.refunding_secs as f64)
    .bind(args.cancelling_secs as f64)
    .fetch_all(pool)
    .await?;
    let mut report = Report {
        overdue: overdue.len(),
        ..Report::default()
    };
    for (id,) in overdue {
        match reconcile(pool, gateway, args, id).await? {
            Outcome::Reconciled => report.reconciled += 1,
            Outcome::Resent => report.resent += 1,
            Outcome::ManualReview => report.manual_review += 1,
            Outcome::Skipped => report.skipped += 1,
        }
    }
    Ok(report)
}

/// Handles overdue order `id`: the gateway's record, a re-send, or review.
#[tracing::instrument(skip(pool, gateway, args))]
pub async fn reconcile(
    pool: &PgPool,
    gateway: &gateway::Client,
    args: &DeadlineArgs,
    id: Uuid,
) -> anyhow::Result<Outcome> {
    let mut conn = pool.acquire().await?;
    let Some(order) = orders::get(&mut conn, id).await? else {
        return Ok(Outcome::Skipped);
    };
    drop(conn);
    let state = order.status;
    // The gateway first (outside any transaction: it is a network call).
    let answer = match gateway_key(&order) {
        Some(key) => match gateway.lookup(&key).await {
            Ok(movement) => movement.and_then(|m| as_reply(&m)),
            Err(e) => {
                tracing::warn!(error = %e, "gateway lookup failed; the order waits for the next scan");
                return Ok(finish(state, Outcome::Skipped));
            }
        },
        None => None,
    };
    let mut tx = pool.begin().await?;
    let Some(order) = orders::lock(&mut tx, id).await? else {
        return Ok(Outcome::Skipped);
    };
    let still_overdue = order.status == state
        && args
            .deadline(state)
            .is_some_and(|d| (chrono::Utc::now() - order.updated_at).to_std().unwrap_or_default() >= d);
    if !still_overdue {
        // The reply arrived meanwhile.
        return Ok(finish(state, Outcome::Skipped));
    }
    let outcome = if let Some(reply) = answer {
        advance(&mut tx, &order, Input::Reconciled(&reply), None).await?;
        tracing::info!(status = state.as_str(), reply = %reply.to_parts().0, "reconciled from the gateway's record");
        Outcome::Reconciled
    } else if order.reconcile_attempts >= args.max_resends {
        advance(&mut tx, &order, Input::DeadlineExceeded, None).await?;
        tracing::warn!(
            status = state.as_str(),
            resends = order.reconcile_attempts,
            "still overdue after every re-send: manual review"
        );
        Outcome::ManualReview
    } else {
        resend(&mut tx, &order).await?;
        Outcome::Resent
    };
    tx.commit().await?;
    Ok(finish(state, outcome))
}

fn finish(state: Status, outcome: Outcome) -> Outcome {
    telemetry::metrics::incr(
        "saga_deadline_actions_total",
        &[("status", state.as_str()), ("action", outcome.as_str())],
    );
    outcome
}

/// The gateway key of the payment operation `order`'s state waits on: the
/// key payment-service derives from the command that state sent.
fn gateway_key(order: &Order) -> Option<String> {
    let command = crate::saga::transitions::command(order, order.status)?;
    contract::message::PaymentOperation::of_command(order.id, &command).map(|op| op.gateway_key())
}

/// The reply payment-service would have sent for the gateway's `movement`.
fn as_reply(movement: &gateway::Operation) -> Option<Message> {
    use gateway_client::api::{EntryKind, EntryStatus};
    Some(match (movement.kind, movement.status) {
        (EntryKind::Charge, EntryStatus::Captured) => Message::PaymentCaptured {
            charge_id: movement.id.to_string(),
        },
        (EntryKind::Charge, EntryStatus::Declined) => Message::PaymentDeclined {
            reason: "card_declined".into(),
        },
        (EntryKind::Refund, EntryStatus::Refunded) => Message::PaymentRefunded {
            refund_id: movement.id.to_string(),
        },
        _ => return None,
    })
}

/// Re-sends the state's command under its first event id (a new one for an
/// order written before commands were recorded), counts the re-send and
/// restarts the deadline.
async fn resend(conn: &mut sqlx::PgConnection, order: &Order) -> anyhow::Result<()> {
    let message = crate::saga::transitions::command(order, order.status).expect("only open states are overdue");
    let event_id = order.last_command_id.unwrap_or_else(Uuid::now_v7);
    saga_kit::emit::emit_again(conn, order.id, &message, event_id).await?;
    sqlx::query(
        "UPDATE orders SET last_command_id = $2, reconcile_attempts = reconcile_attempts + 1, updated_at = now()
         WHERE id = $1",
    )
    .bind(order.id)
    .bind(event_id)
    .execute(&mut *conn)
    .await?;
    let cause = format!("Resent:{}", message.to_parts().0);
    orders::record_history(
        conn,
        order.id,
        Some(order.status),
        order.status,
        &cause,
        Some(event_id),
        false,
    )
    .await?;
    tracing::info!(status = order.status.as_str(), command = %cause, attempt = order.reconcile_attempts + 1, "overdue: command re-sent");
    Ok(())
}

/// One scan, as the periodic task runs it (every `RECONCILE_INTERVAL_SECS`):
/// the report logged when it found overdue orders.
pub async fn scan(pool: &PgPool, gateway: &gateway::Client, args: &DeadlineArgs) -> anyhow::Result<()> {
    let r = tick(pool, gateway, args).await?;
    if r.overdue > 0 {
        tracing::info!(?r, "deadline scan");
    }
    Ok(())
}

/// An operator's retry of a refund the gateway refused (an order in
/// MANUAL_REVIEW for `refund_failed`): the next refund attempt, under its
/// own gateway key. Returns the order after the transition, or why not.
pub async fn retry_refund(pool: &PgPool, id: Uuid) -> anyhow::Result<Order> {
    let mut tx = pool.begin().await?;
    let order = orders::lock(&mut tx, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no order {id}"))?;
    anyhow::ensure!(
        order.status == Status::ManualReview && order.cancel_reason.as_deref() == Some("refund_failed"),
        "order {id} is {} ({}): only an order in MANUAL_REVIEW after a failed refund can retry it",
        order.status.as_str(),
        order.cancel_reason.as_deref().unwrap_or("no reason")
    );
    // The row is locked: the attempt read above is the one to bump.
    sqlx::query("UPDATE orders SET refund_attempt = refund_attempt + 1 WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let order = Order {
        refund_attempt: order.refund_attempt + 1,
        ..order
    };
    anyhow::ensure!(
        advance(&mut tx, &order, Input::RetryRefund, None).await?,
        "the retry was not applied"
    );
    tx.commit().await?;
    let mut conn = pool.acquire().await?;
    Ok(orders::get(&mut conn, id).await?.expect("exists"))
}

/// Orders in MANUAL_REVIEW, oldest first: (id, reason, since).
pub async fn manual_review(pool: &PgPool) -> sqlx::Result<Vec<(Uuid, Option<String>, chrono::DateTime<chrono::Utc>)>> {
    sqlx::query_as(
        "SELECT id, cancel_reason, updated_at FROM orders WHERE status = 'MANUAL_REVIEW' ORDER BY updated_at",
    )
    .fetch_all(pool)
    .await
}
