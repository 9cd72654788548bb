//! order-api: accepts orders over HTTP (with `Idempotency-Key`) and
//! orchestrates the order saga from the replies of inventory and payment.
//!
//! [`build`] connects, migrates and binds; [`App::run`] serves until the
//! shutdown token is cancelled. Tests start the real service on port 0.

pub mod http;
pub mod orders;
pub mod saga;

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Consumer group (and inbox consumer name) of the saga.
pub const SAGA_CONSUMER: &str = "order-saga";

/// order-api configuration, from environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "order-api", about = "Orders HTTP API and saga orchestrator")]
pub struct Config {
    /// PostgreSQL URL of the `orders` database (created if missing).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/orders"
    )]
    pub database_url: String,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Address of the HTTP API (also serves /health and /metrics).
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// How long a completed Idempotency-Key is remembered.
    #[arg(long, env = "IDEMPOTENCY_TTL_SECS", default_value_t = 86_400)]
    pub idempotency_ttl_secs: u64,
    /// How long inbox rows are kept (must exceed the broker's redelivery window).
    #[arg(long, env = "INBOX_RETENTION_SECS", default_value_t = 7 * 86_400)]
    pub inbox_retention_secs: u64,
    /// Database pool size.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 16)]
    pub pool_size: u32,
}

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    /// The `orders` database.
    pub pool: PgPool,
    /// Idempotency-Key lifetime.
    pub idempotency_ttl: Duration,
}

/// A built, not yet running, order-api.
pub struct App {
    state: AppState,
    listener: TcpListener,
    config: Config,
}

/// Connects to the `orders` database, creating and migrating it (the
/// outbox, inbox and idempotency tables, then the orders schema).
pub async fn connect(database_url: &str, pool_size: u32) -> anyhow::Result<PgPool> {
    Ok(runtime::db::connect(
        database_url,
        pool_size,
        vec![
            outbox::migrator(),
            inbox::migrator(),
            idempotency::migrator(),
            sqlx::migrate!("../../migrations/orders"),
        ],
    )
    .await?)
}

/// Connects to the database (creating and migrating it), creates the topics
/// and binds the HTTP listener.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let pool = connect(&config.database_url, config.pool_size).await?;
    messaging::kafka::ensure_topics(&config.kafka_brokers, &messaging::message::TOPICS).await?;
    let listener = TcpListener::bind(config.http_addr).await?;
    let state = AppState {
        pool,
        idempotency_ttl: Duration::from_secs(config.idempotency_ttl_secs),
    };
    Ok(App {
        state,
        listener,
        config,
    })
}

impl App {
    /// The bound HTTP address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Serves HTTP and runs the saga consumer and the reaper until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), "order-api listening");
        let settings = messaging::consumer::ConsumerSettings {
            brokers: self.config.kafka_brokers.clone(),
            group_id: SAGA_CONSUMER.into(),
            topics: vec![messaging::message::ORDER_EVENTS.into()],
        };
        let pool = self.state.pool.clone();
        let saga = tokio::spawn(messaging::consumer::run(settings, shutdown.clone(), move |env| {
            let pool = pool.clone();
            async move { saga::handle(&pool, env).await }
        }));
        let inbox_retention = tokio::spawn(inbox::run_retention(
            self.state.pool.clone(),
            Duration::from_secs(self.config.inbox_retention_secs),
            shutdown.clone(),
        ));
        let key_reaper = tokio::spawn(idempotency::run_reaper(self.state.pool.clone(), shutdown.clone()));
        let app = http::router(self.state.clone()).merge(runtime::admin::router(self.state.pool.clone()));
        runtime::admin::serve(self.listener, app, shutdown.clone()).await?;
        shutdown.cancel();
        saga.await??;
        inbox_retention.await?;
        key_reaper.await?;
        Ok(())
    }
}
