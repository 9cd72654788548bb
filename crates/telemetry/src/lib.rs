//! What every process shares for observability:
//!
//! - [`trace`]: the global subscriber — log lines (text or JSON, each with
//!   its trace and span id) and OpenTelemetry spans exported over OTLP when
//!   an endpoint is set;
//! - [`propagation`]: a span's context as a W3C `traceparent`, into and out
//!   of HTTP headers, outbox rows and Kafka headers;
//! - [`metrics`]: counters and gauges rendered on every service's `/metrics`.

mod logfmt;
pub mod metrics;
pub mod propagation;
pub mod trace;

pub use trace::{init, Guard, Settings};
