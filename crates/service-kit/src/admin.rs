//! Admin endpoints every service exposes: liveness, readiness and metrics
//! in the Prometheus text format.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use sqlx::PgPool;

use crate::Health;

/// How long readiness waits for the database's answer.
const DATABASE_CHECK: std::time::Duration = std::time::Duration::from_millis(800);

#[derive(Clone)]
struct Ready {
    pool: PgPool,
    health: Health,
}

/// Router with `/health/live`, `/health/ready` and `/metrics`.
pub fn router(pool: PgPool, health: Health) -> Router {
    Router::new()
        .route("/health/live", get(|| async { "ok" }))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(Ready { pool, health })
}

/// Ready when every supervised task is alive, nothing is still awaited
/// (the broker's first answer) and the database answers.
async fn ready(State(r): State<Ready>) -> impl IntoResponse {
    if let Some(why) = r.health.failure() {
        return (StatusCode::SERVICE_UNAVAILABLE, why);
    }
    if let Some(what) = r.health.waiting_for() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("waiting for {what}"));
    }
    // A probe answers within its own timeout (an orchestrator's is ~1 s):
    // a database that is gone leaves the pool waiting for a connection.
    match tokio::time::timeout(DATABASE_CHECK, sqlx::query("SELECT 1").execute(&r.pool)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready".to_owned()),
        Ok(Err(_)) | Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "database unavailable".to_owned()),
    }
}

async fn metrics() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        telemetry::metrics::render(),
    )
}
