//! The orders an operator looks at first, on the admin port: `GET
//! /orders?status=&q=&limit=` — orders in MANUAL_REVIEW first, then the
//! newest; filtered by status; `q` an order's id or the Idempotency-Key a
//! client placed it with. The journey page lists them when no order is
//! named, each a link to its journey.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Sources;
use crate::orders::Status;

/// Every state, as the filter names them.
const ALL: [Status; 7] = [
    Status::Pending,
    Status::AwaitingPayment,
    Status::Confirmed,
    Status::Refunding,
    Status::Cancelling,
    Status::Cancelled,
    Status::ManualReview,
];

/// One order of the list.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Recent {
    /// The order.
    pub id: Uuid,
    /// Its client.
    pub client_id: String,
    /// Its state now.
    pub status: Status,
    /// What was ordered.
    pub sku: String,
    /// How many.
    pub quantity: i32,
    /// Its amount.
    pub amount_cents: i64,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// Its last change.
    pub updated_at: DateTime<Utc>,
}

/// The list's filters.
#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    /// Only orders in this state (`CONFIRMED`, `MANUAL_REVIEW`, …).
    pub status: Option<String>,
    /// An order's id, or the Idempotency-Key it was placed with.
    pub q: Option<String>,
    /// At most this many (1..=200; default 50).
    pub limit: Option<i64>,
}

/// `GET /orders` on the admin port.
pub async fn list(
    State(src): State<Sources>,
    Query(f): Query<Filter>,
) -> Result<Json<Vec<Recent>>, (StatusCode, String)> {
    let status = match f.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            ALL.into_iter()
                .find(|st| st.as_str() == s)
                .ok_or_else(|| (StatusCode::BAD_REQUEST, format!("no status {s:?}")))?,
        ),
    };
    let limit = f.limit.unwrap_or(50).clamp(1, 200);
    let q = f.q.as_deref().map(str::trim).filter(|q| !q.is_empty());
    recent(&src.state.pool, status, q, limit)
        .await
        .map(Json)
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("orders database: {e}")))
}

/// The orders of the list: MANUAL_REVIEW first, then the newest.
pub async fn recent(
    pool: &sqlx::PgPool,
    status: Option<Status>,
    q: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<Recent>> {
    // An id, or the key's stored answer's Location (`/orders/<id>`).
    let by_key = "SELECT substr(h->>1, 9)::uuid FROM idempotency_keys k, jsonb_array_elements(k.headers) h
                  WHERE k.key = $2 AND h->>0 = 'location' AND h->>1 LIKE '/orders/%'";
    sqlx::query_as(&format!(
        "SELECT id, client_id, status, sku, quantity, amount_cents, created_at, updated_at FROM orders
         WHERE ($1::text IS NULL OR status = $1)
           AND ($2::text IS NULL OR id::text = $2 OR id IN ({by_key}))
         ORDER BY status = 'MANUAL_REVIEW' DESC, created_at DESC
         LIMIT $3"
    ))
    .bind(status.map(Status::as_str))
    .bind(q)
    .bind(limit)
    .fetch_all(pool)
    .await
}
