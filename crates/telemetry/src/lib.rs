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

/// What a process prints to stderr, unbuffered, just before a crash point
/// aborts it: the harness counts a crash point as fired only when it finds
/// this line in the process's own output.
pub const CRASH_POINT_FIRED: &str = "crash point fired:";

/// Aborts the process at crash point `point` (failpoints builds), after
/// saying so on stderr. No destructor, flush or shutdown hook runs: a crash.
pub fn crash_point(point: &str) -> ! {
    eprintln!("{CRASH_POINT_FIRED} {point}");
    std::process::abort()
}
