//! HTTP surface: `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/cancel`.

pub mod error;
pub mod orders;

use axum::routing::{get, post};
use axum::Router;

use crate::AppState;
pub use error::{ApiError, Problem};

/// The API router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/orders", post(orders::create))
        .route("/orders/{id}", get(orders::show))
        .route("/orders/{id}/cancel", post(orders::cancel))
        .with_state(state)
}
