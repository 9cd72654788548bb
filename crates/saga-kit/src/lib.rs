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
//! - [`retention`]: the retention chain a consumer service refuses to start
//!   without.

pub mod consumer;
pub mod emit;
pub mod inject;
pub mod participant;
pub mod retention;

pub use consumer::SagaConsumer;

/// The metrics of the saga's consumers beyond the consume loop's, for their
/// `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "inbox_misses_total": "Repeated events that passed an inbox as new and were stopped by a business key (the inbox promises zero).",
    counter "consumer_replies_sent_again_total": "Replies enqueued again, under their first ids, because the event they answer came again.",
];
