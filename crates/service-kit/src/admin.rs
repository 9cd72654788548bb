//! Admin endpoints every service exposes: liveness, readiness and metrics
//! in the Prometheus text format, open to whoever reaches the admin port
//! (an orchestrator, Prometheus); and who may read the records a service
//! adds there (an order's journey, its payments): [`AccessArgs`].

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use sqlx::PgPool;

use crate::bearer::Callers;
use crate::{Health, Secret};

/// Who may read an admin port's records — an order's journey, a
/// participant's part of it, payment operations: the operator and the
/// services named in `ADMIN_READERS`. Probes, metrics and `/openapi.json`
/// stay open (they hold no client's data).
#[derive(Clone, Debug, clap::Args)]
pub struct AccessArgs {
    /// The operator's credential for this service (`Authorization: Bearer
    /// …`, or HTTP Basic with it as the password from a browser), ≥ 32
    /// characters, no default; each service has its own.
    #[arg(long, env = "OPERATOR_KEY", value_name = "OPERATOR_KEY", hide_env_values = true)]
    pub operator_key: Secret,
    /// The operator's credential before the last rotation, accepted beside
    /// the new one until every operator has the new one.
    #[arg(
        long,
        env = "OPERATOR_KEY_PREVIOUS",
        value_name = "OPERATOR_KEY_PREVIOUS",
        hide_env_values = true
    )]
    pub previous_operator_key: Option<Secret>,
    /// Services that may read this one's journey records over the admin port
    /// (`name=secret[,…]`; a participant gives order-api's here); unset:
    /// the operator only.
    #[arg(long, env = "ADMIN_READERS", value_name = "ADMIN_READERS", hide_env_values = true)]
    pub readers: Option<Callers>,
}

impl AccessArgs {
    /// The operator, under either of its credentials.
    pub fn operator(&self) -> Callers {
        Callers::rotating(
            "operator",
            self.operator_key.clone(),
            self.previous_operator_key.clone(),
        )
    }

    /// Who may read the admin port's records: the operator and the readers.
    pub fn record_readers(&self) -> Callers {
        match &self.readers {
            Some(readers) => self.operator().and(readers),
            None => self.operator(),
        }
    }

    /// `records` behind [`Self::record_readers`] (401 problem+json to anyone
    /// else, before any handler runs).
    pub fn guard<S: Clone + Send + Sync + 'static>(&self, records: Router<S>) -> Router<S> {
        records.route_layer(axum::middleware::from_fn_with_state(
            self.record_readers(),
            crate::bearer::require_admin,
        ))
    }
}

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
