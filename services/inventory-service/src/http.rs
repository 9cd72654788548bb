//! The stock endpoints: read the levels, set a SKU's count (operators,
//! seeding, tests).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use service_kit::problem::Problem;
use sqlx::PgPool;

/// Stock level of one SKU.
#[derive(Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StockLevel {
    /// SKU.
    pub sku: String,
    /// Units available.
    pub available: i32,
    /// Units held by live reservations.
    pub reserved: i64,
}

fn unavailable(e: sqlx::Error) -> Problem {
    tracing::error!(error = %e, "stock query failed");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "/problems/unavailable",
        "Database unavailable",
        "the stock database did not answer; retry",
    )
}

/// `GET /stock` — available and reserved units per SKU.
#[utoipa::path(
    get,
    path = "/stock",
    tag = "stock",
    responses(
        (status = 200, description = "Every SKU with its available and reserved units", body = Vec<StockLevel>),
        (status = 401, description = "No or wrong operator credential", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(State(pool): State<PgPool>) -> Result<Json<Vec<StockLevel>>, Problem> {
    sqlx::query_as(
        "SELECT s.sku, s.available,
                COALESCE((SELECT sum(quantity) FROM reservations r WHERE r.sku = s.sku AND r.status = 'RESERVED'), 0)::int8 AS reserved
         FROM stock s ORDER BY s.sku",
    )
    .fetch_all(&pool)
    .await
    .map(Json)
    .map_err(unavailable)
}

/// Body of `PUT /stock/{sku}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetStock {
    /// New available count (0..=2147483647; the bench seeds two billion).
    #[schema(minimum = 0, maximum = 2_147_483_647)]
    pub available: i32,
}

/// `PUT /stock/{sku}` — sets the available count (seeding and tests).
#[utoipa::path(
    put,
    path = "/stock/{sku}",
    tag = "stock",
    params(("sku" = String, Path, description = "stock keeping unit (1..=64 characters)")),
    request_body = SetStock,
    responses(
        (status = 204, description = "Set"),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or wrong operator credential", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid count or SKU", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn set(
    State(pool): State<PgPool>,
    axum::Extension(caller): axum::Extension<service_kit::Scope>,
    Path(sku): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, Problem> {
    let refuse =
        |status: StatusCode, kind: &'static str, detail: String| Problem::new(status, kind, "Invalid request", detail);
    let body: SetStock = service_kit::problem::parse_json(&body).map_err(Problem::from)?;
    if body.available < 0 {
        return Err(refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "/problems/unprocessable",
            "available must be >= 0".into(),
        ));
    }
    if sku.is_empty() || sku.len() > 64 {
        return Err(refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "/problems/unprocessable",
            "sku must be 1..=64 characters".into(),
        ));
    }
    // The change and its audit event in one statement: who set which
    // count, and what it was before.
    sqlx::query(
        "WITH before AS (SELECT available FROM stock WHERE sku = $1),
         set AS (
             INSERT INTO stock (sku, available) VALUES ($1, $2)
             ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available, updated_at = now()
             RETURNING available)
         INSERT INTO audit_log (actor, action, subject, detail)
         SELECT $3, 'stock.set', $1,
                'available ' || set.available || coalesce(' (was ' || (SELECT available FROM before) || ')', ' (new)')
         FROM set",
    )
    .bind(&sku)
    .bind(body.available)
    .bind(&caller.0)
    .execute(&pool)
    .await
    .map_err(unavailable)?;
    Ok(StatusCode::NO_CONTENT)
}
