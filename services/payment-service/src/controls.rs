//! The negative controls and injected faults of payment handling (test
//! builds only, feature `failpoints`), kept out of the production path:
//! [`instead`] is called before it and answers for the batch when one of
//! them takes over.

use contract::Envelope;
use kafka::consumer::{HandleError, Handled};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::gateway::Reply;
use crate::payments::{call_gateway, outcome, Command, Operation, DEAD_LETTER_COMMAND};
use crate::Deps;

/// What replaces the real handling of `batch`, if anything: an injected
/// dead letter ([`DEAD_LETTER_COMMAND`]) refuses it; the negative control
/// without deduplication (`UNSAFE_NO_PAYMENT_DEDUP`) handles it with no
/// inbox and a new gateway key per delivery. `None`: handle it for real.
pub(crate) async fn instead(deps: &Deps, batch: &[Command<'_>]) -> Result<Option<Vec<Handled>>, HandleError> {
    for command in batch {
        if refused(command.item.message.event_id, batch.len() == 1) {
            return Err(HandleError::permanent(format!("injected: {DEAD_LETTER_COMMAND}")));
        }
    }
    if !switches::on(switches::Switch::NoPaymentDedup) {
        return Ok(None);
    }
    let mut handled = Vec::with_capacity(batch.len());
    for command in batch {
        let one = handle_without_dedup(deps, &command.item.message, &command.operation);
        handled.push(one.instrument(command.item.span.clone()).await?);
    }
    Ok(Some(handled))
}

/// Whether this delivery of `event_id` is refused as a command that cannot
/// be handled (failpoints builds, [`DEAD_LETTER_COMMAND`]): refused until
/// the lane's one-at-a-time retry refuses it alone and dead-letters it — as
/// a command that could never be handled would be; a later delivery (the
/// saga's re-send) is handled.
fn refused(event_id: Uuid, alone: bool) -> bool {
    static FAULTS: saga_kit::inject::DeadLetter = saga_kit::inject::DeadLetter::new();
    FAULTS.refuses(event_id, alone, picked_to_refuse)
}

/// Whether the fault point [`DEAD_LETTER_COMMAND`] fires for this delivery.
fn picked_to_refuse() -> bool {
    fail::fail_point!(DEAD_LETTER_COMMAND, |_| true);
    false
}

/// The negative control: what payment handling looks like without layers 3
/// and 4 — no inbox, and a gateway key per delivery instead of per operation.
/// Every redelivered or republished command charges again.
async fn handle_without_dedup(deps: &Deps, envelope: &Envelope, operation: &Operation) -> Result<Handled, HandleError> {
    let key = format!("{}-{}", operation.key(envelope.order_id), Uuid::new_v4());
    let reply = call_gateway(deps, operation, &key, envelope.order_id)
        .await
        .map_err(saga_kit::consumer::classify)?;
    let (_, reply) = outcome(operation.kind(), Reply::of(&reply))?;
    let mut tx = deps.pool.begin().await.map_err(saga_kit::consumer::classify)?;
    saga_kit::emit::emit(&mut tx, envelope.order_id, &reply, Some(envelope))
        .await
        .map_err(saga_kit::consumer::classify)?;
    tx.commit().await.map_err(saga_kit::consumer::classify)?;
    Ok(Handled::Applied)
}
