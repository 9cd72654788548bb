//! The payment operations recorded for one order, on the admin port
//! (`GET /payments/{order_id}`): order-api's journey of an order reads them
//! and looks each key up at the gateway.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use saga_kit::journey::PaymentRecord;
use sqlx::PgPool;
use uuid::Uuid;

/// The operations of `order_id`, in the order recorded.
pub async fn of_order(pool: &PgPool, order_id: Uuid) -> sqlx::Result<Vec<PaymentRecord>> {
    sqlx::query_as(
        "SELECT kind, idempotency_key, amount_cents, status, attempts, created_at, updated_at, reconciled_at
         FROM payments WHERE order_id = $1 ORDER BY created_at",
    )
    .bind(order_id)
    .fetch_all(pool)
    .await
}

async fn show(
    State(pool): State<PgPool>,
    Path(order_id): Path<Uuid>,
) -> Result<Json<Vec<PaymentRecord>>, (StatusCode, String)> {
    of_order(&pool, order_id)
        .await
        .map(Json)
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")))
}

/// The route, to merge into the admin router.
pub fn router(pool: PgPool) -> axum::Router {
    axum::Router::new()
        .route("/payments/{order_id}", axum::routing::get(show))
        .with_state(pool)
}
