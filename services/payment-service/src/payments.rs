//! Charge and refund, resumable across crashes (layer 4 of docs/design.md).
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

use contract::topics::consumers::PAYMENT;
use contract::{Envelope, Message};
use kafka::consumer::{HandleError, Handled, Traced};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::gateway::Reply;
use crate::Deps;

/// Fault point (failpoints builds): refuse the command as if it could never
/// be handled, so it goes to the dead-letter topic — the saga's deadline
/// must still end the order (it re-sends the command under its event id).
pub const DEAD_LETTER_COMMAND: &str = "payment::dead_letter_command";

/// Crash point (failpoints builds): abort after the gateway answered,
/// before the result is recorded — the redelivery must ask the gateway again
/// with the same key and get the same charge back.
pub const CRASH_AFTER_GATEWAY_BEFORE_RECORD: &str = "payment::after_gateway_before_record";

pub use contract::message::PaymentKind;

/// Where a payment operation stands (stored as `PENDING`, …). A status, not
/// a "done" flag: `PENDING` says the gateway may or may not have acted, so
/// it must be asked again with the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Recorded; the gateway's answer is not.
    Pending,
    /// The charge was captured.
    Captured,
    /// The charge was declined.
    Declined,
    /// The refund was made.
    Refunded,
    /// The gateway refused the refund for good (the order goes to manual
    /// review; an operator's retry is a new attempt under a new key).
    Failed,
}

impl Status {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Captured => "CAPTURED",
            Status::Declined => "DECLINED",
            Status::Refunded => "REFUNDED",
            Status::Failed => "FAILED",
        }
    }
}

/// What a payment command asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Operation {
    Charge { amount_cents: i64, card_token: String },
    Refund { amount_cents: i64, attempt: u32 },
}

impl Operation {
    fn from_message(message: Message) -> Result<Self, HandleError> {
        match message {
            Message::ChargePayment { amount_cents, card } => Ok(Self::Charge {
                amount_cents,
                card_token: card,
            }),
            Message::RefundPayment { amount_cents, attempt } => Ok(Self::Refund {
                amount_cents,
                attempt: attempt.max(1),
            }),
            other => Err(HandleError::permanent(format!(
                "unexpected message {other:?} on payment.commands"
            ))),
        }
    }

    pub(crate) fn kind(&self) -> PaymentKind {
        match self {
            Self::Charge { .. } => PaymentKind::Charge,
            Self::Refund { .. } => PaymentKind::Refund,
        }
    }

    fn amount_cents(&self) -> i64 {
        match self {
            Self::Charge { amount_cents, .. } | Self::Refund { amount_cents, .. } => *amount_cents,
        }
    }

    fn attempt(&self) -> u32 {
        match self {
            Self::Charge { .. } => 1,
            Self::Refund { attempt, .. } => *attempt,
        }
    }

    /// The operation this is, for `order_id`: what its gateway key names.
    fn of(&self, order_id: Uuid) -> contract::message::PaymentOperation {
        contract::message::PaymentOperation {
            order_id,
            kind: self.kind(),
            attempt: self.attempt(),
        }
    }

    /// The gateway key: derived from the operation, never from the message.
    pub(crate) fn key(&self, order_id: Uuid) -> String {
        self.of(order_id).gateway_key()
    }
}

/// One command of a batch: its delivery, the operation it names, and the
/// gateway's result once this batch asked for it.
pub(crate) struct Command<'a> {
    pub(crate) item: &'a Traced<Envelope>,
    pub(crate) operation: Operation,
    result: Option<(Status, Message)>,
}

impl<'a> Command<'a> {
    fn of(item: &'a Traced<Envelope>) -> Result<Self, HandleError> {
        let message = item.message.message().map_err(HandleError::permanent)?;
        Ok(Self {
            item,
            operation: Operation::from_message(message)?,
            result: None,
        })
    }

    fn order_id(&self) -> Uuid {
        self.item.message.order_id
    }

    /// The payment row it names: `(order, kind)`.
    fn payment(&self) -> (Uuid, PaymentKind) {
        (self.order_id(), self.operation.kind())
    }
}

/// Gateway calls in flight at once per partition lane (each order's own
/// calls stay in order; different orders' calls overlap).
pub const GATEWAY_CALLS_PER_LANE: usize = 16;

/// Handles one payment command: a batch of one.
pub async fn handle(deps: &Deps, envelope: Envelope) -> Result<Handled, HandleError> {
    saga_kit::consumer::handle_one(envelope, |batch| handle_batch(deps, batch)).await
}

/// Handles a partition's queued payment commands (in order) in three steps
/// whatever their number: one transaction records every new operation as
/// `PENDING`, the gateway calls run concurrently (up to
/// [`GATEWAY_CALLS_PER_LANE`], an order's calls one after another), and one
/// transaction records every result with its inbox row and reply. All or
/// nothing: an error leaves every offset for redelivery, and the redelivery
/// asks the gateway again under the same keys and gets the same answers.
pub async fn handle_batch(deps: &Deps, batch: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, HandleError> {
    let mut commands = batch.iter().map(Command::of).collect::<Result<Vec<_>, _>>()?;
    // Test builds only: the injected dead letter and the negative control
    // without deduplication (crate::controls), swapped in before the real path.
    #[cfg(feature = "failpoints")]
    if let Some(handled) = crate::controls::instead(deps, &commands).await? {
        return Ok(handled);
    }

    // Redeliveries stop here, before anything is written or called for
    // them; step 3's inbox insert finds them again, skips them and counts
    // each redelivery once, in the batch's transaction.
    let mut conn = deps.pool.acquire().await.map_err(saga_kit::consumer::classify)?;
    let ids: Vec<Uuid> = batch.iter().map(|t| t.message.event_id).collect();
    let seen = inbox::seen(&mut conn, PAYMENT.name, &ids)
        .await
        .map_err(saga_kit::consumer::classify)?;
    drop(conn);
    let unseen: Vec<usize> = (0..batch.len()).filter(|i| !seen.contains(&ids[*i])).collect();

    // Step 1: every operation, recorded before money moves, in one commit.
    // Which of them this batch must take to the gateway: those left PENDING
    // at their own attempt, each operation once.
    let to_call = open(deps, &commands, &unseen).await?;

    // Step 2: the external effects, made safe to repeat by their keys.
    for (i, result) in call_all(deps, &commands, &to_call).await? {
        commands[i].result = Some(result);
    }
    // Only where money may have moved: a batch that called nobody has
    // nothing to record.
    if !to_call.is_empty() {
        fail::fail_point!(CRASH_AFTER_GATEWAY_BEFORE_RECORD, |_| telemetry::crash_point(
            CRASH_AFTER_GATEWAY_BEFORE_RECORD
        ));
    }

    // Step 3: every result and reply, atomically with the inbox rows.
    let (mut tx, fresh) = saga_kit::consumer::begin(&deps.pool, PAYMENT.name, &batch).await?;
    if !fresh.is_empty() {
        settle(&mut tx, &commands, &fresh.indices())
            .await
            .map_err(saga_kit::consumer::classify)?;
    }
    saga_kit::consumer::commit(tx, &fresh).await
}

/// Step 1 for the batch's `fresh` commands, in one transaction: a new
/// operation is inserted as PENDING; a known one counts this attempt, and a
/// later attempt of a FAILED refund (an operator's retry) reopens it under
/// its new key. Returns the indexes whose operation is PENDING at this
/// command's attempt — the first command of each operation only (a repeat
/// of it in the same batch settles nothing: step 3 finds it settled).
///
/// One statement for the batch ([`upsert_operations`]), split where a
/// command names an operation already in it — one upsert cannot touch a
/// row twice: the rest go in the next statement, in batch order, so each
/// command sees its row as the commands before it left it.
async fn open(deps: &Deps, commands: &[Command<'_>], fresh: &[usize]) -> Result<Vec<usize>, HandleError> {
    let mut tx = deps.pool.begin().await.map_err(saga_kit::consumer::classify)?;
    let mut to_call = Vec::with_capacity(fresh.len());
    let mut opened = std::collections::HashSet::new();
    let mut rest = fresh;
    while !rest.is_empty() {
        let mut named = std::collections::HashSet::new();
        let split = rest
            .iter()
            .position(|&i| !named.insert(commands[i].payment()))
            .unwrap_or(rest.len());
        let (now, later) = rest.split_at(split);
        rest = later;
        let rows = upsert_operations(&mut tx, commands, now)
            .await
            .map_err(saga_kit::consumer::classify)?;
        for (&i, (status, attempt)) in now.iter().zip(rows) {
            let (command, operation) = (&commands[i], &commands[i].operation);
            let kind = operation.kind();
            let first = opened.insert((command.order_id(), kind, operation.attempt()));
            if first && status == Status::Pending && attempt == operation.attempt() as i32 {
                to_call.push(i);
            } else {
                // Settled by an earlier command for the same operation (a new
                // event id for the same charge): its reply was sent then.
                let _span = command.item.span.enter();
                tracing::info!(status = status.as_str(), "payment already settled; command is a no-op");
                telemetry::metrics::incr("payment_repeat_commands_total", &[("kind", kind.as_str())]);
            }
        }
    }
    tx.commit().await.map_err(saga_kit::consumer::classify)?;
    Ok(to_call)
}

/// Inserts, or counts the attempt of, the operations of commands `at` —
/// each naming a different operation — in one statement. Returns each
/// one's status and attempt after it, in the order of `at`.
async fn upsert_operations(
    tx: &mut sqlx::PgConnection,
    commands: &[Command<'_>],
    at: &[usize],
) -> sqlx::Result<Vec<(Status, i32)>> {
    let operations: Vec<&Operation> = at.iter().map(|&i| &commands[i].operation).collect();
    let order_ids: Vec<Uuid> = at.iter().map(|&i| commands[i].order_id()).collect();
    let kinds: Vec<&str> = operations.iter().map(|o| o.kind().as_str()).collect();
    // The SET expressions all read the row as it was, so `reopen` is one
    // decision for every column.
    let rows: Vec<(Uuid, String, Status, i32)> = sqlx::query_as(
        "INSERT INTO payments (order_id, kind, idempotency_key, amount_cents, status, attempt, attempts)
         SELECT o, k, key, amount, $5, attempt, 1
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[], $6::int4[]) AS v(o, k, key, amount, attempt)
         ON CONFLICT (order_id, kind) DO UPDATE
         SET attempts = payments.attempts + 1, updated_at = now(),
             status = CASE WHEN payments.status = 'FAILED' AND payments.attempt < EXCLUDED.attempt
                           THEN EXCLUDED.status ELSE payments.status END,
             attempt = CASE WHEN payments.status = 'FAILED' AND payments.attempt < EXCLUDED.attempt
                            THEN EXCLUDED.attempt ELSE payments.attempt END,
             idempotency_key = CASE WHEN payments.status = 'FAILED' AND payments.attempt < EXCLUDED.attempt
                                    THEN EXCLUDED.idempotency_key ELSE payments.idempotency_key END
         RETURNING order_id, kind, status, attempt",
    )
    .bind(&order_ids)
    .bind(&kinds)
    .bind(
        operations
            .iter()
            .zip(&order_ids)
            .map(|(o, id)| o.key(*id))
            .collect::<Vec<_>>(),
    )
    .bind(operations.iter().map(|o| o.amount_cents()).collect::<Vec<_>>())
    .bind(Status::Pending)
    .bind(operations.iter().map(|o| o.attempt() as i32).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await?;
    // RETURNING has no order: find each command's row by its key.
    let rows: std::collections::HashMap<(Uuid, String), (Status, i32)> = rows
        .into_iter()
        .map(|(o, k, status, attempt)| ((o, k), (status, attempt)))
        .collect();
    Ok(order_ids
        .iter()
        .zip(&kinds)
        .map(|(o, k)| rows[&(*o, (*k).to_owned())])
        .collect())
}

/// Step 2: the gateway calls of `to_call`, concurrently across orders and
/// in batch order within one, each in its command's span. Any transient
/// failure fails the batch (its redelivery repeats every call, under the
/// same keys).
async fn call_all(
    deps: &Deps,
    commands: &[Command<'_>],
    to_call: &[usize],
) -> Result<Vec<(usize, (Status, Message))>, HandleError> {
    use futures::{StreamExt as _, TryStreamExt as _};
    // Each order's calls, in batch order; the orders in the order they came.
    let mut by_order: Vec<(Uuid, Vec<usize>)> = Vec::new();
    let mut lane_of = std::collections::HashMap::new();
    for &i in to_call {
        let order_id = commands[i].order_id();
        let lane = *lane_of.entry(order_id).or_insert_with(|| {
            by_order.push((order_id, Vec::new()));
            by_order.len() - 1
        });
        by_order[lane].1.push(i);
    }
    let chains = by_order.into_iter().map(|(order_id, calls)| async move {
        let mut done = Vec::with_capacity(calls.len());
        for i in calls {
            let operation = &commands[i].operation;
            let key = operation.key(order_id);
            let call = call_gateway(deps, operation, &key, order_id).instrument(commands[i].item.span.clone());
            let reply = Reply::from_call(call.await).map_err(HandleError::unavailable)?;
            // A refusal is as definite as a decline: the same key always gets it.
            done.push((i, outcome(operation.kind(), reply)?));
        }
        Ok::<_, HandleError>(done)
    });
    let chains: Vec<Vec<_>> = futures::stream::iter(chains)
        .buffer_unordered(GATEWAY_CALLS_PER_LANE)
        .try_collect()
        .await?;
    Ok(chains.into_iter().flatten().collect())
}

/// Step 3 for the batch's commands new to the inbox, in the batch's
/// transaction: the results move their payments out of PENDING and enqueue
/// their replies ([`record_all`], one statement each); a new command whose
/// payment was settled already is a miss the business key caught, and
/// counted as one.
async fn settle(tx: &mut sqlx::PgConnection, commands: &[Command<'_>], fresh: &[usize]) -> outbox::Result<()> {
    let (with_result, settlements): (Vec<usize>, Vec<Settlement<'_>>) = fresh
        .iter()
        .filter_map(|&i| {
            let command = &commands[i];
            let (status, reply) = command.result.as_ref()?;
            let settlement = Settlement {
                order_id: command.order_id(),
                kind: command.operation.kind(),
                status: *status,
                reply,
                cause: Some(&command.item.message),
                span: &command.item.span,
            };
            Some((i, settlement))
        })
        .unzip();
    let moved = record_all(tx, &settlements).await?;
    // The deliveries that settled their payment.
    let settled_here: std::collections::HashSet<usize> = with_result
        .iter()
        .zip(moved)
        .filter_map(|(&i, moved)| moved.then_some(i))
        .collect();
    for &i in fresh {
        let (envelope, kind) = (&commands[i].item.message, commands[i].operation.kind());
        if !settled_here.contains(&i) && !settled_by_reconciliation(tx, envelope.order_id, kind).await? {
            saga_kit::consumer::note_miss(
                tx,
                PAYMENT.name,
                envelope.event_id,
                envelope.order_id,
                "payment per operation",
            )
            .await?;
        }
    }
    Ok(())
}

/// A gateway's answer to record: payment `(order_id, kind)` moves to
/// `status` and `reply` goes out, caused by `cause`, in `span`'s trace.
pub(crate) struct Settlement<'a> {
    pub order_id: Uuid,
    pub kind: PaymentKind,
    pub status: Status,
    pub reply: &'a Message,
    pub cause: Option<&'a Envelope>,
    pub span: &'a tracing::Span,
}

/// Moves each payment of `settlements` (at most one per payment) out of
/// PENDING to its status and enqueues its reply, in the caller's
/// transaction and two statements. Only the caller that moves a payment
/// replies (a concurrent delivery or the reconciler that lost the race
/// stays silent); returns, per settlement, whether this one did.
pub(crate) async fn record_all(
    tx: &mut sqlx::PgConnection,
    settlements: &[Settlement<'_>],
) -> outbox::Result<Vec<bool>> {
    if settlements.is_empty() {
        return Ok(Vec::new());
    }
    let gateway_ref = |reply: &Message| match reply {
        Message::PaymentCaptured { charge_id } => Some(charge_id.clone()),
        Message::PaymentRefunded { refund_id } => Some(refund_id.clone()),
        _ => None,
    };
    let moved: Vec<(Uuid, String)> = sqlx::query_as(
        "UPDATE payments p SET status = v.status, gateway_ref = v.gateway_ref, updated_at = now()
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS v(order_id, kind, status, gateway_ref)
         WHERE p.order_id = v.order_id AND p.kind = v.kind AND p.status = $5
         RETURNING p.order_id, p.kind",
    )
    .bind(settlements.iter().map(|s| s.order_id).collect::<Vec<_>>())
    .bind(settlements.iter().map(|s| s.kind.as_str()).collect::<Vec<_>>())
    .bind(settlements.iter().map(|s| s.status.as_str()).collect::<Vec<_>>())
    .bind(settlements.iter().map(|s| gateway_ref(s.reply)).collect::<Vec<_>>())
    .bind(Status::Pending)
    .fetch_all(&mut *tx)
    .await?;
    let moved: std::collections::HashSet<(Uuid, String)> = moved.into_iter().collect();
    let moved: Vec<bool> = settlements
        .iter()
        .map(|s| moved.contains(&(s.order_id, s.kind.as_str().to_owned())))
        .collect();
    let mut replies = Vec::new();
    for (s, _) in settlements.iter().zip(&moved).filter(|(_, moved)| **moved) {
        telemetry::metrics::incr("payment_settled_total", &[("status", s.status.as_str())]);
        s.span
            .in_scope(|| tracing::debug!(target: telemetry::trace::PER_ORDER, status = s.status.as_str(), reply = %s.reply.to_parts().0, "payment settled"));
        let envelope = saga_kit::emit::envelope(s.order_id, s.reply, s.cause, s.span);
        replies.push((s.reply.clone(), envelope));
    }
    saga_kit::emit::reply_all(tx, PAYMENT.name, &replies).await?;
    Ok(moved)
}

/// Whether the reconciler settled payment `(order_id, kind)` from the
/// gateway's record (a command arriving after that is expected, not a miss).
async fn settled_by_reconciliation(
    tx: &mut sqlx::PgConnection,
    order_id: Uuid,
    kind: PaymentKind,
) -> outbox::Result<bool> {
    let reconciled =
        sqlx::query_scalar("SELECT reconciled_at IS NOT NULL FROM payments WHERE order_id = $1 AND kind = $2")
            .bind(order_id)
            .bind(kind)
            .fetch_optional(&mut *tx)
            .await?;
    Ok(reconciled.unwrap_or(false))
}

/// Charges or refunds through the gateway, as `operation` asks, under `key`.
pub(crate) async fn call_gateway(
    deps: &Deps,
    operation: &Operation,
    key: &str,
    order_id: Uuid,
) -> Result<gateway_client::api::Movement, gateway_client::Error> {
    match operation {
        Operation::Charge {
            amount_cents,
            card_token,
        } => {
            let body = gateway_client::api::ChargeRequest {
                order_id,
                amount_cents: *amount_cents,
                card_token: card_token.clone(),
            };
            deps.gateway.charge(key, &body).await
        }
        Operation::Refund { amount_cents, .. } => {
            let body = gateway_client::api::RefundRequest {
                order_id,
                amount_cents: *amount_cents,
            };
            deps.gateway.refund(key, &body).await
        }
    }
}

/// The payment's new status and the reply to send for the gateway's answer.
pub fn outcome(kind: PaymentKind, reply: Reply) -> Result<(Status, Message), HandleError> {
    Ok(match (kind, reply) {
        (PaymentKind::Charge, Reply::Done(id)) => (Status::Captured, Message::PaymentCaptured { charge_id: id }),
        (PaymentKind::Charge, Reply::Declined(_)) => (
            Status::Declined,
            Message::PaymentDeclined {
                reason: "card_declined".into(),
            },
        ),
        (PaymentKind::Charge, Reply::Refused(why)) => (
            Status::Declined,
            Message::PaymentDeclined {
                reason: format!("refused: {why}"),
            },
        ),
        (PaymentKind::Refund, Reply::Done(id)) => (Status::Refunded, Message::PaymentRefunded { refund_id: id }),
        (PaymentKind::Refund, Reply::Declined(id)) => (
            Status::Failed,
            Message::RefundFailed {
                reason: format!("refund {id} declined"),
            },
        ),
        (PaymentKind::Refund, Reply::Refused(why)) => (Status::Failed, Message::RefundFailed { reason: why }),
    })
}
