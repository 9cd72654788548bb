//! payment-service: consumes `payment.commands`, charges and refunds through
//! the gateway, and replies on `order.events` through its outbox.

#[cfg(feature = "failpoints")]
#[cfg(feature = "failpoints")]
mod controls;
pub mod gateway;
pub mod payments;
pub mod reconcile;
pub mod records;

use std::net::SocketAddr;
use std::time::Duration;

use contract::topics::consumers;
use saga_kit::SagaConsumer;
use service_kit::{DbArgs, LogArgs, Supervisor};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Process name, in logs and metrics.
pub const NAME: &str = "payment-service";

/// payment-service configuration, from arguments or environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "payment-service", about = "Payments for the order saga")]
#[command(mut_arg("url", |a| a.default_value("postgres://postgres@127.0.0.1:5432/payments")))]
pub struct Config {
    /// The `payments` database.
    #[command(flatten)]
    pub db: DbArgs,
    /// The broker, the inbox retention and the negative controls.
    #[command(flatten)]
    pub saga: saga_kit::participant::ParticipantArgs,
    /// Address of the admin endpoints (`/health/*`, `/metrics`), its only
    /// HTTP port: the orchestrator's probes and Prometheus, never published.
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9182")]
    pub admin_addr: SocketAddr,
    /// The payment gateway (charges and refunds) and payment-service's
    /// credential there.
    #[command(flatten)]
    pub gateway: gateway_client::GatewayArgs,
    /// How long the gateway remembers an Idempotency-Key, in seconds (the
    /// provider's documented key lifetime; the mock gateway's
    /// `IDEMPOTENCY_TTL_SECS`). Must be at least `INBOX_RETENTION_SECS`.
    #[arg(long, env = "GATEWAY_KEY_TTL_SECS", default_value_t = 8 * 86_400)]
    pub gateway_key_ttl_secs: u64,
    /// The operator's credential for the records on the admin port (the
    /// order's payments, its journey part) and who else may read them.
    #[command(flatten)]
    pub access: service_kit::admin::AccessArgs,
    /// Seconds an operation may stay PENDING before the gateway is asked
    /// what it did under the operation's key.
    #[arg(long, env = "PAYMENT_PENDING_DEADLINE_SECS", default_value_t = 60)]
    pub pending_deadline_secs: u64,
    /// Seconds between scans for overdue PENDING operations.
    #[arg(long, env = "RECONCILE_INTERVAL_SECS", default_value_t = 5)]
    pub reconcile_interval_secs: u64,
    /// Logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Handler state.
#[derive(Clone)]
pub struct Deps {
    /// The `payments` database.
    pub pool: PgPool,
    /// The gateway client.
    pub gateway: gateway::Client,
}

/// A built payment-service.
pub struct App {
    deps: Deps,
    listener: TcpListener,
    config: Config,
}

/// The negative controls this service can run (`switches::Switches::install` refuses others).
pub const SWITCHES: [switches::Switch; 4] = [
    switches::Switch::NoInbox,
    switches::Switch::InboxSeparateTx,
    switches::Switch::NoPaymentDedup,
    switches::Switch::OffsetBeforeHandling,
];

/// Connects, migrates and binds (the topics are made sure of when the consumer starts).
pub async fn build(config: Config) -> anyhow::Result<App> {
    config.saga.check(
        NAME,
        &SWITCHES,
        &[METRICS, gateway_client::METRICS],
        Some(config.gateway_key_ttl_secs),
    )?;
    // The gateway's settings first: an http:// URL is refused before any connection.
    let gateway = config.gateway.client()?;
    let pool = saga_kit::participant::connect(
        &config.db.url,
        config.db.pool_size,
        vec![sqlx::migrate!("../../migrations/payments")],
    )
    .await?;
    config.saga.grant_relay(&pool).await?;
    let listener = TcpListener::bind(config.admin_addr).await?;
    let deps = Deps { pool, gateway };
    Ok(App { deps, listener, config })
}

impl App {
    /// The bound admin address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Runs the payment consumer (charges and refunds at the gateway), the
    /// pending-payment reconciler, the inbox retention and the admin
    /// endpoints until `shutdown`, or until one of them dies (then returns
    /// its error).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut tasks = Supervisor::new(shutdown);
        let config = &self.config;
        let consumer = SagaConsumer::new(consumers::PAYMENT, &config.saga, &self.deps.pool);
        consumer.spawn_batches(&mut tasks, self.deps.clone(), |deps, batch| async move {
            payments::handle_batch(&deps, batch).await
        });
        let (deps, deadline) = (self.deps.clone(), Duration::from_secs(config.pending_deadline_secs));
        tasks.spawn_every(
            "pending payments",
            Duration::from_secs(config.reconcile_interval_secs.max(1)),
            move || {
                let deps = deps.clone();
                async move { reconcile::scan(&deps, deadline).await }
            },
        );
        let admin =
            service_kit::admin::router(&self.deps.pool, tasks.health()).merge(self.config.access.guard(
                saga_kit::journey::router(self.deps.pool.clone()).merge(records::router(self.deps.pool.clone())),
            ));
        tasks.serve_admin(self.listener, admin);
        tasks.wait().await
    }
}

/// The metrics payment-service records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "payment_settled_total": "Charges and refunds settled with the gateway.",
    counter "payment_repeat_commands_total": "Payment commands already settled (no-ops).",
    counter "payment_reconciliations_total": "Overdue PENDING operations looked up at the gateway, by result (settled, absent, skipped).",
    gauge "payments_pending": "Payment operations PENDING (the gateway's answer not recorded yet).",
    gauge "payments_oldest_pending_seconds": "Age of the oldest PENDING payment operation (0 when none).",
];

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[tokio::test]
    async fn a_configuration_that_breaks_the_retention_chain_refuses_to_start() {
        // Checked before anything is connected: no database or broker needed.
        let short_inbox = Config::try_parse_from([
            "payment-service",
            "--database-url",
            "postgres://unused",
            "--gateway-api-key",
            &"k".repeat(32),
            "--operator-key",
            &"o".repeat(32),
            "--kafka-plaintext",
            "--inbox-retention-secs",
            "3600",
        ])
        .unwrap();
        let e = build(short_inbox).await.err().expect("refused").to_string();
        assert!(
            e.contains("INBOX_RETENTION_SECS") && e.contains("KAFKA_TOPIC_RETENTION_SECS"),
            "{e}"
        );
        let short_keys = Config::try_parse_from([
            "payment-service",
            "--database-url",
            "postgres://unused",
            "--gateway-api-key",
            &"k".repeat(32),
            "--operator-key",
            &"o".repeat(32),
            "--kafka-plaintext",
            "--gateway-key-ttl-secs",
            "86400",
        ])
        .unwrap();
        let e = build(short_keys).await.err().expect("refused").to_string();
        assert!(
            e.contains("GATEWAY_KEY_TTL_SECS") && e.contains("INBOX_RETENTION_SECS"),
            "{e}"
        );
    }
}
