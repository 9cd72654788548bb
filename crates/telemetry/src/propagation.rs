//! Carrying a span's context across a hop as a W3C `traceparent`: into and
//! out of HTTP headers, outbox rows and Kafka headers.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header (and outbox column) that carries the context.
pub const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of `span`, when it belongs to a trace.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.remove(TRACEPARENT)
}

/// The `traceparent` of the current span.
pub fn current() -> Option<String> {
    traceparent(&tracing::Span::current())
}

/// Makes `span` a child of the context in `traceparent` (nothing when it
/// is missing or malformed: the span then starts its own trace).
pub fn follow(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), tp.to_owned())]);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    let _ = span.set_parent(cx);
}

/// Makes `span` a child of the context in `traceparent` and returns the
/// span's own `traceparent`: the link an outbox row's publish span makes
/// (`outbox::kafka::KafkaPublisher::trace_with`).
pub fn link(span: &tracing::Span, traceparent: Option<&str>) -> Option<String> {
    follow(span, traceparent);
    self::traceparent(span)
}

/// Makes `span` a child of the context in `headers`.
pub fn follow_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    let _ = span.set_parent(cx);
}

/// Links `span` to the context in `headers`, without making it a child:
/// the span roots a trace of its own and names the caller's as related.
/// For a public port, whose callers are not ours to trust: a client's
/// `traceparent` must not decide the trace id, the sampling or the parent
/// of the work its request causes (W3C Trace Context, "privacy and
/// security"; OpenTelemetry's advice for public endpoints). Returns whether
/// the headers held a valid context.
pub fn link_headers(span: &tracing::Span, headers: &http::HeaderMap) -> bool {
    use opentelemetry::trace::TraceContextExt as _;
    // A root, even if some span is current around the serve loop.
    let _ = span.set_parent(opentelemetry::Context::new());
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    let remote = cx.span().span_context().clone();
    if !remote.is_valid() {
        return false;
    }
    span.add_link(remote);
    true
}

/// Writes the current span's context into outgoing HTTP `headers`.
pub fn inject_headers(headers: &mut http::HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut HeaderInjector(headers)));
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
