//! W3C Trace Context (`traceparent`) values carried in the event envelope.
//!
//! Each hop keeps the trace id and gets a fresh span id, so the log lines of
//! one order across all services share one trace id.

use rand::RngCore;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(len: usize) -> String {
    let mut buf = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut buf);
    hex(&buf)
}

/// Starts a new trace: `00-<trace id>-<span id>-01`.
pub fn new_traceparent() -> String {
    format!("00-{}-{}-01", random_hex(16), random_hex(8))
}

/// The trace id of a `traceparent`, when it is well formed.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, trace, span, _flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (trace.len() == 32 && span.len() == 16).then_some(trace)
}

/// A child of `parent`: same trace id, new span id. A missing or malformed
/// parent starts a new trace.
pub fn child_of(parent: Option<&str>) -> String {
    match parent.and_then(trace_id) {
        Some(trace) => format!("00-{trace}-{}-01", random_hex(8)),
        None => new_traceparent(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_keeps_trace_id() {
        let root = new_traceparent();
        let child = child_of(Some(&root));
        assert_eq!(trace_id(&root), trace_id(&child));
        assert_ne!(root, child);
        assert!(trace_id(&child_of(Some("garbage"))).is_some());
    }
}
