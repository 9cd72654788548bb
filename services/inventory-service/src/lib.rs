//! inventory-service: consumes `inventory.commands`, reserves and releases
//! stock, and replies on `order.events` through its outbox.
//!
//! Also serves `GET /stock` and `PUT /stock/{sku}` (set the available count),
//! used by the demo and the tests to seed and audit stock: an operator's
//! endpoints, behind the operator credential (`OPERATOR_KEY`).

pub mod http;
pub mod stock;

use std::net::SocketAddr;

use axum::routing::{get, put};
use axum::Router;
use contract::topics::consumers;
use saga_kit::SagaConsumer;
use service_kit::bearer::CALLER_SCHEME;
use service_kit::{DbArgs, LogArgs, Supervisor};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Process name, in logs and metrics.
pub const NAME: &str = "inventory-service";

/// inventory-service configuration, from arguments or environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "inventory-service", about = "Stock reservations for the order saga")]
#[command(mut_arg("url", |a| a.default_value("postgres://postgres@127.0.0.1:5432/inventory")))]
pub struct Config {
    /// The `inventory` database.
    #[command(flatten)]
    pub db: DbArgs,
    /// The broker, the inbox retention and the negative controls.
    #[command(flatten)]
    pub saga: saga_kit::participant::ParticipantArgs,
    /// Address of the operator's stock endpoints.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8081")]
    pub http_addr: SocketAddr,
    /// Address of the admin endpoints (`/health/*`, `/metrics`, `/openapi.json`): the
    /// orchestrator's probes and Prometheus, never published beside the API.
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9181")]
    pub admin_addr: SocketAddr,
    /// The HTTP port's limits: header and body read timeouts, connections at once.
    #[command(flatten)]
    pub http: service_kit::ServeArgs,
    /// The operator's credential (the stock endpoints, and the journey
    /// records on the admin port) and who else may read those records.
    #[command(flatten)]
    pub access: service_kit::admin::AccessArgs,
    /// Logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// inventory-service's OpenAPI 3.1 document (`utoipa`): the stock
/// endpoints, served at `/openapi.json`, committed as
/// docs/openapi/inventory-service.json.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "inventory-service",
        description = "Stock levels of the effectively-once saga (seeding and audit); reservations travel over Kafka. Errors are RFC 9457 problem+json."
    ),
    paths(http::list, http::set),
    modifiers(&CALLER_SCHEME),
    security(("bearer" = [])),
    components(schemas(http::StockLevel, http::SetStock, service_kit::problem::Problem))
)]
pub struct ApiDoc;

/// The document as pretty JSON.
pub fn openapi_json() -> String {
    service_kit::http::openapi_json::<ApiDoc>()
}

/// A built inventory-service.
pub struct App {
    pool: PgPool,
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
}

/// Connects to the `inventory` database, creating and migrating it.
pub async fn connect(database_url: &str, pool_size: u32) -> anyhow::Result<PgPool> {
    saga_kit::participant::connect(
        database_url,
        pool_size,
        vec![sqlx::migrate!("../../migrations/inventory")],
    )
    .await
}

/// The negative controls this service can run (`switches::Switches::install` refuses others).
pub const SWITCHES: [switches::Switch; 3] = [
    switches::Switch::NoInbox,
    switches::Switch::InboxSeparateTx,
    switches::Switch::OffsetBeforeHandling,
];

/// Connects, migrates and binds (the topics are made sure of when the consumer starts).
pub async fn build(config: Config) -> anyhow::Result<App> {
    config.saga.check(NAME, &SWITCHES, &[METRICS], None)?;
    let pool = connect(&config.db.url, config.db.pool_size).await?;
    config.saga.grant_relay(&pool).await?;
    let listener = TcpListener::bind(config.http_addr).await?;
    let admin = TcpListener::bind(config.admin_addr).await?;
    Ok(App {
        pool,
        listener,
        admin,
        config,
    })
}

impl App {
    /// The bound HTTP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr().expect("bound listener")
    }

    /// Runs the stock consumer (reservations in, replies out), its inbox
    /// retention and the operator's stock endpoints until `shutdown`, or
    /// until one of them dies (then returns its error).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut tasks = Supervisor::new(shutdown);
        let consumer = SagaConsumer::new(consumers::INVENTORY, &self.config.saga, &self.pool);
        consumer.spawn_batches(&mut tasks, self.pool.clone(), |pool, envelopes| async move {
            stock::handle_batch(&pool, envelopes).await
        });
        let operator = self.config.access.operator();
        let app = Router::new()
            .route("/stock", get(http::list))
            .route("/stock/{sku}", put(http::set))
            .route_layer(axum::middleware::from_fn_with_state(
                operator,
                service_kit::bearer::require,
            ))
            .with_state(self.pool.clone());
        let admin = service_kit::admin::router(&self.pool, tasks.health())
            .route("/openapi.json", service_kit::http::openapi_route::<(), ApiDoc>())
            .merge(self.config.access.guard(saga_kit::journey::router(self.pool.clone())));
        tasks.serve(self.listener, app, self.config.http.clone());
        tasks.serve_admin(self.admin, admin);
        tasks.wait().await
    }
}

/// The metrics inventory-service records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "inventory_reserved_total": "Reservations made.",
    counter "inventory_rejected_total": "Reservations refused (out of stock, invalid).",
    counter "inventory_released_total": "Reservations released.",
    counter "inventory_repeat_commands_total": "Commands for an order already reserved/released (no-ops).",
];
