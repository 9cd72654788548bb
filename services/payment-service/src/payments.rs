//! Charge and refund, resumable across crashes (layer 4 of DESIGN.md).
//!
//! 1. Record the operation as `PENDING` under a key derived from the
//!    operation (`charge-<order>` / `refund-<order>`) and commit — before any
//!    money moves, so a crash from here on leaves a trace to resume from.
//! 2. Call the gateway with that key as `Idempotency-Key`.
//! 3. In one transaction: inbox row, `PENDING → CAPTURED | DECLINED |
//!    REFUNDED`, and the reply's outbox row.
//!
//! A crash between 2 and 3 (the gateway charged, nothing recorded) leaves the
//! offset uncommitted and the payment `PENDING`: the redelivery calls the
//! gateway again with the same key and gets the same charge back. Recording
//! "processed" before step 2 would instead lose the charge (scenario 13).

use messaging::consumer::{HandleError, Handled};
use messaging::{Envelope, Message};

use crate::gateway::{CallError, Reply};
use crate::Deps;

/// Handles one payment command.
#[tracing::instrument(skip_all, fields(order_id = %envelope.order_id, event_type = %envelope.event_type, event_id = %envelope.event_id))]
pub async fn handle(deps: &Deps, envelope: Envelope) -> Result<Handled, HandleError> {
    let message = envelope.message().map_err(HandleError::permanent)?;
    let (kind, amount_cents) = match &message {
        Message::ChargePayment { amount_cents, .. } => ("charge", *amount_cents),
        Message::RefundPayment { amount_cents } => ("refund", *amount_cents),
        other => {
            return Err(HandleError::Permanent(format!(
                "unexpected message {other:?} on payment.commands"
            )))
        }
    };
    let order_id = envelope.order_id;
    if !deps.dedup {
        return handle_without_dedup(deps, &envelope, &message, kind, amount_cents).await;
    }
    let mut conn = deps.pool.acquire().await.map_err(HandleError::transient)?;
    if inbox::seen(&mut conn, crate::CONSUMER, envelope.event_id)
        .await
        .map_err(HandleError::transient)?
    {
        inbox::note_redelivery(&mut conn, crate::CONSUMER, envelope.event_id)
            .await
            .map_err(HandleError::transient)?;
        return Ok(Handled::Duplicate);
    }

    // Step 1: the operation, recorded before money moves.
    let key = format!("{kind}-{order_id}");
    sqlx::query(
        "INSERT INTO payments (order_id, kind, idempotency_key, amount_cents, status)
         VALUES ($1, $2, $3, $4, 'PENDING') ON CONFLICT (order_id, kind) DO NOTHING",
    )
    .bind(order_id)
    .bind(kind)
    .bind(&key)
    .bind(amount_cents)
    .execute(&mut *conn)
    .await
    .map_err(HandleError::transient)?;
    let status: String = sqlx::query_scalar(
        "UPDATE payments SET attempts = attempts + 1, updated_at = now()
         WHERE order_id = $1 AND kind = $2 RETURNING status",
    )
    .bind(order_id)
    .bind(kind)
    .fetch_one(&mut *conn)
    .await
    .map_err(HandleError::transient)?;
    drop(conn);
    if status != "PENDING" {
        // Settled by an earlier command for the same operation (a new event
        // id for the same charge): its reply was sent then. Nothing to do.
        tracing::info!(%status, "payment already settled; command is a no-op");
        telemetry::metrics::incr("payment_repeat_commands_total", &[("kind", kind)]);
        return settle(deps, &envelope, kind, None).await;
    }

    // Step 2: the external effect, made safe to repeat by the key.
    let reply = match call_gateway(deps, &message, &key, order_id, amount_cents).await {
        Ok(r) => r,
        Err(CallError::Retry(e)) => return Err(HandleError::Transient(e)),
        Err(CallError::Refused(e)) => return Err(HandleError::Permanent(e)),
    };
    fail::fail_point!("payment::after_gateway_before_record", |_| std::process::abort());

    // Step 3: record the result and reply, atomically with the inbox row.
    let (new_status, reply_message) = outcome(kind, reply)?;
    settle(deps, &envelope, kind, Some((new_status, reply_message))).await
}

/// Records the inbox row and, when given, moves the payment out of PENDING
/// and enqueues the reply — all in one transaction.
async fn settle(
    deps: &Deps,
    envelope: &Envelope,
    kind: &str,
    result: Option<(&str, Message)>,
) -> Result<Handled, HandleError> {
    let Some(mut tx) = inbox::begin(&deps.pool, crate::CONSUMER, envelope.event_id)
        .await
        .map_err(HandleError::transient)?
    else {
        // Another instance handled this very event meanwhile.
        return Ok(Handled::Duplicate);
    };
    if let Some((status, reply)) = result {
        let gateway_ref = match &reply {
            Message::PaymentCaptured { charge_id } => Some(charge_id.clone()),
            Message::PaymentRefunded { refund_id } => Some(refund_id.clone()),
            _ => None,
        };
        let moved = sqlx::query(
            "UPDATE payments SET status = $3, gateway_ref = $4, updated_at = now()
             WHERE order_id = $1 AND kind = $2 AND status = 'PENDING'",
        )
        .bind(envelope.order_id)
        .bind(kind)
        .bind(status)
        .bind(gateway_ref)
        .execute(&mut *tx)
        .await
        .map_err(HandleError::transient)?
        .rows_affected();
        // Only the delivery that settles the payment replies; a concurrent
        // one that lost the race (different event id) stays silent.
        if moved == 1 {
            outbox::emit(&mut tx, envelope.order_id, &reply, Some(envelope))
                .await
                .map_err(HandleError::transient)?;
            telemetry::metrics::incr("payment_settled_total", &[("status", status)]);
        }
    }
    tx.commit().await.map_err(HandleError::transient)?;
    Ok(Handled::Applied)
}

/// The negative control: what payment handling looks like without layers 3
/// and 4 — no inbox, and a gateway key per delivery instead of per operation.
/// Every redelivered or republished command charges again.
async fn handle_without_dedup(
    deps: &Deps,
    envelope: &Envelope,
    message: &Message,
    kind: &str,
    amount_cents: i64,
) -> Result<Handled, HandleError> {
    let key = format!("{kind}-{}-{}", envelope.order_id, uuid::Uuid::new_v4());
    let reply = call_gateway(deps, message, &key, envelope.order_id, amount_cents)
        .await
        .map_err(HandleError::transient)?;
    let (_, reply) = outcome(kind, reply)?;
    let mut tx = deps.pool.begin().await.map_err(HandleError::transient)?;
    outbox::emit(&mut tx, envelope.order_id, &reply, Some(envelope))
        .await
        .map_err(HandleError::transient)?;
    tx.commit().await.map_err(HandleError::transient)?;
    Ok(Handled::Applied)
}

/// Charges or refunds through the gateway, as `message` asks, under `key`.
async fn call_gateway(
    deps: &Deps,
    message: &Message,
    key: &str,
    order_id: uuid::Uuid,
    amount_cents: i64,
) -> Result<Reply, CallError> {
    match message {
        Message::ChargePayment { card, .. } => deps.gateway.charge(key, order_id, amount_cents, card).await,
        _ => deps.gateway.refund(key, order_id, amount_cents).await,
    }
}

/// The payment's new status and the reply to send for the gateway's answer.
fn outcome(kind: &str, reply: Reply) -> Result<(&'static str, Message), HandleError> {
    Ok(match (kind, reply) {
        ("charge", Reply::Done(id)) => ("CAPTURED", Message::PaymentCaptured { charge_id: id }),
        ("charge", Reply::Declined(_)) => (
            "DECLINED",
            Message::PaymentDeclined {
                reason: "card_declined".into(),
            },
        ),
        (_, Reply::Done(id)) => ("REFUNDED", Message::PaymentRefunded { refund_id: id }),
        (_, Reply::Declined(id)) => return Err(HandleError::Permanent(format!("refund {id} declined"))),
    })
}
