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
///
/// Readiness asks the database on a connection of its own, opened on the
/// first probe from `pool`'s settings: a probe that queued behind the
/// requests for `pool`'s connections would call a restarted service under a
/// backlog of retrying clients "not ready" until the backlog had drained
/// (order-api, SIGKILLed in the 100 orders/s chaos run on CI: about 29 s
/// to ready, while it was answering them; ~1 s with its own connection).
/// The service's load shows in its latency metrics, not in readiness.
pub fn router(pool: &PgPool, health: Health) -> Router {
    let probe = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(DATABASE_CHECK)
        .connect_lazy_with((*pool.connect_options()).clone());
    Router::new()
        .route("/health/live", get(|| async { "ok" }))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(Ready { pool: probe, health })
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
