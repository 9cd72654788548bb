//! Admin endpoints every service exposes: liveness, readiness (the database
//! answers) and metrics in the Prometheus text format.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Router with `/health/live`, `/health/ready` and `/metrics`.
pub fn router(pool: PgPool) -> Router {
    Router::new()
        .route("/health/live", get(|| async { "ok" }))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(pool)
}

/// Ready when the database answers. The `X-Process-Id` header tells a
/// supervisor which process answered (not another one on a reused port).
async fn ready(State(pool): State<PgPool>) -> impl IntoResponse {
    let pid = [(PROCESS_ID_HEADER, std::process::id().to_string())];
    match sqlx::query("SELECT 1").execute(&pool).await {
        Ok(_) => (StatusCode::OK, pid, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, pid, "database unavailable"),
    }
}

/// Header of `/health/ready` carrying the answering process's id.
pub const PROCESS_ID_HEADER: &str = "x-process-id";

async fn metrics() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        telemetry::metrics::render(),
    )
}

/// Serves `app` on `listener` until `shutdown` is cancelled.
pub async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
