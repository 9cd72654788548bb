//! payment-service: consumes `payment.commands`, charges and refunds through
//! the gateway, and replies on `order.events` through its outbox.

pub mod gateway;
pub mod payments;

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Consumer group and inbox consumer name.
pub const CONSUMER: &str = "payment-service";

/// payment-service configuration, from environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "payment-service", about = "Payments for the order saga")]
pub struct Config {
    /// PostgreSQL URL of the `payments` database (created if missing).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/payments"
    )]
    pub database_url: String,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Address of the admin endpoints.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8082")]
    pub http_addr: SocketAddr,
    /// Base URL of the payment gateway.
    #[arg(long, env = "GATEWAY_URL", default_value = "http://127.0.0.1:8083")]
    pub gateway_url: String,
    /// Gateway request timeout in milliseconds.
    #[arg(long, env = "GATEWAY_TIMEOUT_MS", default_value_t = 2_000)]
    pub gateway_timeout_ms: u64,
    /// How long inbox rows are kept (must exceed the broker's redelivery window).
    #[arg(long, env = "INBOX_RETENTION_SECS", default_value_t = 7 * 86_400)]
    pub inbox_retention_secs: u64,
    /// NEGATIVE CONTROL ONLY: turn off deduplication (no inbox, a new gateway
    /// key per delivery). The chaos suite uses it to prove its checker finds
    /// double charges. Never set it anywhere else.
    #[arg(long, env = "PAYMENT_UNSAFE_DISABLE_DEDUP", default_value_t = false)]
    pub unsafe_disable_dedup: bool,
}

/// Handler state.
#[derive(Clone)]
pub struct Deps {
    /// The `payments` database.
    pub pool: PgPool,
    /// The gateway client.
    pub gateway: gateway::Client,
    /// False only in the negative control.
    pub dedup: bool,
}

/// A built payment-service.
pub struct App {
    deps: Deps,
    listener: TcpListener,
    config: Config,
}

/// Connects, migrates, creates topics and binds.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let pool = runtime::db::connect(
        &config.database_url,
        8,
        vec![
            outbox::migrator(),
            inbox::migrator(),
            sqlx::migrate!("../../migrations/payments"),
        ],
    )
    .await?;
    messaging::kafka::ensure_topics(&config.kafka_brokers, &messaging::message::TOPICS).await?;
    let gateway = gateway::Client::new(&config.gateway_url, Duration::from_millis(config.gateway_timeout_ms))?;
    let listener = TcpListener::bind(config.http_addr).await?;
    if config.unsafe_disable_dedup {
        tracing::error!("PAYMENT_UNSAFE_DISABLE_DEDUP is set: duplicates WILL be charged twice (negative control)");
    }
    let deps = Deps {
        pool,
        gateway,
        dedup: !config.unsafe_disable_dedup,
    };
    Ok(App { deps, listener, config })
}

impl App {
    /// The bound admin address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Runs the consumer and admin endpoints until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), "payment-service listening");
        let settings = messaging::consumer::ConsumerSettings {
            brokers: self.config.kafka_brokers.clone(),
            group_id: CONSUMER.into(),
            topics: vec![messaging::message::PAYMENT_COMMANDS.into()],
        };
        let deps = self.deps.clone();
        let consumer = tokio::spawn(messaging::consumer::run(settings, shutdown.clone(), move |env| {
            let deps = deps.clone();
            async move { payments::handle(&deps, env).await }
        }));
        let retention = tokio::spawn(inbox::run_retention(
            self.deps.pool.clone(),
            Duration::from_secs(self.config.inbox_retention_secs),
            shutdown.clone(),
        ));
        let app = runtime::admin::router(self.deps.pool.clone());
        runtime::admin::serve(self.listener, app, shutdown.clone()).await?;
        shutdown.cancel();
        consumer.await??;
        retention.await?;
        Ok(())
    }
}
