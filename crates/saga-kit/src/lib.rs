//! The saga's glue: where the protocol (`contract`) meets the layers of
//! idempotency (`outbox`, `inbox`, `kafka`), which know nothing of each
//! other. The process plumbing (config, database, supervisor, HTTP) is
//! `service-kit`, which links no messaging crate.
//!
//! - [`emit`]: emit a saga message through the outbox, in the caller's
//!   transaction;
//! - [`consumer`]: [`consumer::begin`] and [`consumer::commit`], the
//!   transaction every batching consumer opens with its inbox rows and
//!   commits with its effects, and a saga consumer with its inbox retention
//!   as supervised tasks;
//! - [`participant`]: what a participant service checks and connects
//!   before it runs;
//! - [`journey`]: one order's footprint in a service's database (outbox
//!   rows, inbox records, redeliveries absorbed), for its admin endpoint;
//! - [`retention`]: the retention chain a consumer service refuses to start
//!   without;
//! - [`projection`]: a consumer that needs no inbox — a read model whose
//!   write is idempotent and commutative by its key.
//!
//! One verb per act, across the project:
//!
//! | verb | the act | where |
//! |---|---|---|
//! | enqueue | write an outbox row in the caller's transaction (`_all`: many in one statement; `_again`: under an id already sent, for a re-send) | `outbox` |
//! | emit | build a saga message's envelope (new event id, cause, trace context) and enqueue it | [`emit`] |
//! | record | write an inbox row (`inbox::record_batch`), a history row, a ledger row | `inbox`, the services |
//! | advance | move an order's saga by one input (a reply, a cancel, a deadline) | order-api's `saga` |
//! | apply | an event's effect taken, with its inbox row (`Handled::Applied`, `Decision::Apply`); `Handled::Ignored`: new to the inbox, nothing to take | `kafka`, the handlers |

pub mod consumer;
pub mod emit;
pub mod inject;
pub mod journey;
pub mod participant;
pub mod projection;
pub mod retention;

pub use consumer::SagaConsumer;

/// The metrics of the saga's consumers beyond the consume loop's, for their
/// `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "inbox_misses_total": "Repeated events that passed an inbox as new and were stopped by a business key (the inbox promises zero).",
    counter "consumer_replies_sent_again_total": "Replies enqueued again, under their first ids, because the event they answer came again.",
    counter "inbox_reused_ids_total": "Events refused (dead-lettered) because their id was recorded for another fact (another type or body): an event id used twice.",
    counter "consumer_refused_total": "Events refused (dead-lettered) because their producer stamp is not the service that sends their type.",
];
