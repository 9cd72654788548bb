//! HTTP surface: `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/cancel`.

pub mod admission;
pub mod error;
pub mod links;
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
    modifiers(&API_KEY),
    security(("api_key" = [])),
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

/// The API key scheme: `Authorization: Bearer <key>` on every `/orders` route.
const API_KEY: service_kit::bearer::BearerScheme = service_kit::bearer::BearerScheme {
    name: "api_key",
    description: "An API key from `order-api keys create --client <id>`",
};

/// The document as pretty JSON.
pub fn openapi_json() -> String {
    service_kit::http::openapi_json::<ApiDoc>()
}

/// The API router: `/orders` behind admission control (outermost: a
/// refusal under load costs no key check), API keys and per-client limits.
pub fn router(state: AppState) -> Router {
    let auth = axum::middleware::from_fn_with_state(state.auth.clone(), crate::auth::middleware);
    let admission = axum::middleware::from_fn_with_state(state.admission.clone(), admission::middleware);
    Router::new()
        .route("/orders", post(orders::create))
        .route("/orders/{id}", get(orders::show))
        .route("/orders/{id}/cancel", post(orders::cancel))
        .route_layer(auth)
        .route_layer(admission)
        .with_state(state)
}

/// The admin router: health, metrics, `/openapi.json` and, behind the
/// operator's credential, an order's journey (`crate::journey`), on the
/// admin listener only.
pub fn admin_router(
    state: AppState,
    health: service_kit::Health,
    journey: crate::journey::JourneyArgs,
    access: &service_kit::admin::AccessArgs,
) -> Router {
    let journeys = Router::new()
        .route("/orders/{id}/journey", get(crate::journey::show))
        .route("/journey", get(crate::journey::page))
        .route("/orders", get(crate::journey::recent::list))
        .with_state(crate::journey::Sources::new(state.clone(), journey));
    service_kit::admin::router(&state.pool, health)
        .route("/openapi.json", service_kit::http::openapi_route::<(), ApiDoc>())
        .merge(access.guard(journeys))
}
