//! Telemetry shared by every service: log set-up, a process-wide metrics
//! registry rendered in the Prometheus text format, and W3C `traceparent`
//! helpers so a trace id follows an order across the asynchronous Kafka hops.

pub mod metrics;
pub mod trace;

use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber.
///
/// `RUST_LOG` selects levels (default `info`); `LOG_FORMAT=json` switches to
/// one JSON object per line, the production format.
pub fn init(service: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let result = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.with_ansi(false).try_init()
    };
    // A second init (tests that start several services in one process) keeps the first.
    let _ = result;
    metrics::set_service(service);
}
