//! Process-wide metrics, rendered in the Prometheus text format by every
//! service's `/metrics`. Logging is set up by `service-kit`; the trace
//! context that follows an order across Kafka hops is part of the envelope
//! (`contract::traceparent`).

pub mod metrics;
