//! HTTP surface: `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/cancel`.

pub mod error;
pub mod orders;

use axum::routing::{get, post};
use axum::Router;

use crate::AppState;
pub use error::{ApiError, Problem};

/// The OpenAPI 3.1 document of this API, generated from the handlers and
/// types (`utoipa`); served at `/openapi.json`, committed as
/// docs/openapi/order-api.json (a test keeps the two equal).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "order-api",
        description = "Orders of the effectively-once saga. Every POST needs an Idempotency-Key; errors are RFC 9457 problem+json."
    ),
    paths(orders::create, orders::show, orders::cancel),
    components(schemas(
        orders::CreateOrder,
        orders::OrderView,
        crate::orders::Order,
        crate::orders::HistoryEntry,
        crate::orders::Status,
        Problem
    ))
)]
pub struct ApiDoc;

/// The document as pretty JSON.
pub fn openapi_json() -> String {
    use utoipa::OpenApi as _;
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serialises")
}

/// The API router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/orders", post(orders::create))
        .route("/orders/{id}", get(orders::show))
        .route("/orders/{id}/cancel", post(orders::cancel))
        .route(
            "/openapi.json",
            get(|| async { ([(axum::http::header::CONTENT_TYPE, "application/json")], openapi_json()) }),
        )
        .with_state(state)
}
