//! inventory-service: consumes `inventory.commands`, reserves and releases
//! stock, and replies on `order.events` through its outbox.
//!
//! Also serves `GET /stock` and `PUT /stock/{sku}` (set the available count),
//! used by the demo and the tests to seed and audit stock.

pub mod stock;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, put};
use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Consumer group and inbox consumer name.
pub const CONSUMER: &str = "inventory-service";

/// inventory-service configuration, from environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "inventory-service", about = "Stock reservations for the order saga")]
pub struct Config {
    /// PostgreSQL URL of the `inventory` database (created if missing).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/inventory"
    )]
    pub database_url: String,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Address of the admin/stock HTTP endpoints.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8081")]
    pub http_addr: SocketAddr,
    /// How long inbox rows are kept (must exceed the broker's redelivery window).
    #[arg(long, env = "INBOX_RETENTION_SECS", default_value_t = 7 * 86_400)]
    pub inbox_retention_secs: u64,
}

/// A built inventory-service.
pub struct App {
    pool: PgPool,
    listener: TcpListener,
    config: Config,
}

/// Connects to the `inventory` database, creating and migrating it.
pub async fn connect(database_url: &str) -> anyhow::Result<PgPool> {
    Ok(runtime::db::connect(
        database_url,
        8,
        vec![
            outbox::migrator(),
            inbox::migrator(),
            sqlx::migrate!("../../migrations/inventory"),
        ],
    )
    .await?)
}

/// Connects, migrates, creates topics and binds.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let pool = connect(&config.database_url).await?;
    messaging::kafka::ensure_topics(&config.kafka_brokers, &messaging::message::TOPICS).await?;
    let listener = TcpListener::bind(config.http_addr).await?;
    Ok(App { pool, listener, config })
}

impl App {
    /// The bound HTTP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Runs the consumer and the HTTP endpoints until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), "inventory-service listening");
        let settings = messaging::consumer::ConsumerSettings {
            brokers: self.config.kafka_brokers.clone(),
            group_id: CONSUMER.into(),
            topics: vec![messaging::message::INVENTORY_COMMANDS.into()],
        };
        let pool = self.pool.clone();
        let consumer = tokio::spawn(messaging::consumer::run(settings, shutdown.clone(), move |env| {
            let pool = pool.clone();
            async move { stock::handle(&pool, env).await }
        }));
        let reaper = tokio::spawn(inbox::run_retention(
            self.pool.clone(),
            Duration::from_secs(self.config.inbox_retention_secs),
            shutdown.clone(),
        ));
        let app = Router::new()
            .route("/stock", get(stock::list))
            .route("/stock/{sku}", put(stock::set))
            .with_state(self.pool.clone())
            .merge(runtime::admin::router(self.pool.clone()));
        runtime::admin::serve(self.listener, app, shutdown.clone()).await?;
        shutdown.cancel();
        consumer.await??;
        reaper.await?;
        Ok(())
    }
}
