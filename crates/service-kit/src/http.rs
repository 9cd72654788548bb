//! The server span of every HTTP request: named `METHOD /route`, a child of
//! the caller's `traceparent` when the request carries one, with the status
//! code recorded, and its latency in `http_server_request_duration_seconds`.
//! Health and metrics probes are neither traced nor timed. The labels are
//! bounded: a path no route matched is `unmatched` (a scan of random paths
//! would otherwise make one time series each), a method outside the
//! standard ones `other`.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

/// Axum middleware: `router.layer(axum::middleware::from_fn(service_kit::http::trace))`.
/// The caller's `traceparent` is the parent: for ports our own services call.
pub async fn trace(req: Request, next: Next) -> Response {
    traced(req, next, Caller::Ours).await
}

/// [`trace`] for a public port: the caller's `traceparent` is linked, not
/// followed — each request roots a trace of its own
/// (`telemetry::propagation::link_headers`).
pub async fn trace_public(req: Request, next: Next) -> Response {
    traced(req, next, Caller::Public).await
}

/// Who calls a port, which decides what its `traceparent` is to the span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Our own services: their context is the parent.
    Ours,
    /// Anyone: their context is a link.
    Public,
}

async fn traced(req: Request, next: Next, caller: Caller) -> Response {
    let path = req.uri().path();
    if path.starts_with("/health") || path == "/metrics" {
        return next.run(req).await;
    }
    let route = route_label(req.extensions().get::<MatchedPath>());
    let method = req.method().clone();
    let method_label = method_label(&method);
    let span = tracing::info_span!(
        "http.request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    match caller {
        Caller::Ours => telemetry::propagation::follow_headers(&span, req.headers()),
        Caller::Public => {
            telemetry::propagation::link_headers(&span, req.headers());
        }
    }
    let started = std::time::Instant::now();
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    telemetry::metrics::observe(
        "http_server_request_duration_seconds",
        &[("method", method_label), ("route", &route), ("status", status.as_str())],
        started.elapsed(),
    );
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// The `route` label: the matched route template, or `unmatched`.
fn route_label(matched: Option<&MatchedPath>) -> String {
    matched.map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned())
}

/// The `method` label: a standard method, or `other`.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The metrics this crate's HTTP layer records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    histogram "http_server_request_duration_seconds": "HTTP request latency by route and status.",
];

/// The OpenAPI document `D` as pretty JSON (what docs/openapi commits).
pub fn openapi_json<D: utoipa::OpenApi>() -> String {
    D::openapi().to_pretty_json().expect("the OpenAPI document serialises")
}

/// `GET /openapi.json`: the document `D`, rendered once when the route is built.
pub fn openapi_route<S: Clone + Send + Sync + 'static, D: utoipa::OpenApi>() -> axum::routing::MethodRouter<S> {
    let json = openapi_json::<D>();
    axum::routing::get(move || {
        let json = json.clone();
        async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], json) }
    })
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn random_paths_and_methods_share_one_label_each() {
        let app = Router::new()
            .route("/orders/{id}", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn(super::trace));
        for (method, path) in [
            ("GET", "/orders/1"),
            ("GET", "/scan-a"),
            ("GET", "/scan-b/x"),
            ("BREW", "/orders/2"),
        ] {
            let req = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())
                .unwrap();
            app.clone().oneshot(req).await.unwrap();
        }
        assert_eq!(super::route_label(None), "unmatched");
        assert_eq!(super::method_label(&"BREW".parse().unwrap()), "other");
        let page = telemetry::metrics::render();
        assert!(page.contains(r#"route="unmatched""#), "{page}");
        assert!(!page.contains("scan-a") && !page.contains("scan-b"), "{page}");
        assert!(!page.contains("BREW"), "{page}");
    }
}
