//! The server span of every HTTP request: named `METHOD /route`, a child of
//! the caller's `traceparent` when the request carries one, with the status
//! code recorded, and its latency in `http_server_request_duration_seconds`.
//! Health and metrics probes are neither traced nor timed.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

/// Axum middleware: `router.layer(axum::middleware::from_fn(service_kit::http::trace))`.
pub async fn trace(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path.starts_with("/health") || path == "/metrics" {
        return next.run(req).await;
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| path.to_owned(), |p| p.as_str().to_owned());
    let method = req.method().clone();
    let span = tracing::info_span!(
        "http.request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    telemetry::propagation::follow_headers(&span, req.headers());
    let started = std::time::Instant::now();
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    telemetry::metrics::observe(
        "http_server_request_duration_seconds",
        &[
            ("method", method.as_str()),
            ("route", &route),
            ("status", status.as_str()),
        ],
        started.elapsed(),
    );
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}
