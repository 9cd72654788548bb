//! outbox-relay: one relay loop per source database (orders, inventory,
//! payments), all sharing one idempotent producer. Any number of relay
//! processes may run at once; see `outbox::relay` for why that is safe.

pub mod guard;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use contract::topics;
use outbox::{KafkaPublisher, Relay};
use service_kit::{LogArgs, Supervisor};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Process name, in logs and metrics.
pub const NAME: &str = "outbox-relay";

/// outbox-relay configuration, from arguments or environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "outbox-relay", about = "Publishes service outboxes to Kafka")]
pub struct Config {
    /// Comma-separated PostgreSQL URLs of the databases whose outbox to relay.
    #[arg(
        long,
        env = "OUTBOX_DATABASE_URLS",
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "postgres://postgres@127.0.0.1:5432/orders,postgres://postgres@127.0.0.1:5432/inventory,postgres://postgres@127.0.0.1:5432/payments"
    )]
    pub database_urls: Vec<String>,
    /// The broker.
    #[command(flatten)]
    pub kafka: kafka::KafkaArgs,
    /// Address of the admin endpoints (`/health/*`, `/metrics`), its only
    /// HTTP port: the orchestrator's probes and Prometheus, never published.
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9184")]
    pub admin_addr: SocketAddr,
    /// Rows claimed per round.
    #[arg(long, env = "RELAY_BATCH", default_value_t = 1024)]
    pub batch: i64,
    /// Claimed batches awaiting the broker at once, per source database:
    /// the next batch is claimed while earlier ones are being published.
    #[arg(long, env = "RELAY_IN_FLIGHT", default_value_t = 2)]
    pub in_flight: usize,
    /// How often an idle relay probes for pending rows, in milliseconds (one
    /// index lookup per source): the longest a new row waits when the relay is idle.
    #[arg(long, env = "RELAY_POLL_MS", default_value_t = 5)]
    pub poll_ms: u64,
    /// How long published rows are kept before deletion.
    #[arg(long, env = "OUTBOX_RETENTION_SECS", default_value_t = outbox::DEFAULT_RETENTION_SECS)]
    pub retention_secs: u64,
    /// Negative controls (test builds only): the layers this service can switch off.
    #[command(flatten)]
    pub switches: switches::Switches,
    /// Logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// The negative controls this service can run (`switches::Switches::install` refuses others).
pub const SWITCHES: [switches::Switch; 3] = [
    switches::Switch::EventIdAtPublish,
    switches::Switch::NoProducerIdempotence,
    switches::Switch::RelayMarksUnsent,
];

/// A built relay.
pub struct App {
    /// Each source: its database's name, the service that owns its outbox, its pool.
    sources: Vec<(String, &'static str, PgPool)>,
    listener: TcpListener,
    config: Config,
}

/// Opens a pool on every source and binds the admin endpoint. The relay
/// creates and migrates nothing: each database and its outbox are the owning
/// service's (and, under a role of its own, the relay may not create them);
/// [`App::run`] waits until every outbox can be read.
pub async fn build(config: Config) -> anyhow::Result<App> {
    config.switches.install("outbox-relay", &SWITCHES)?;
    telemetry::metrics::describe(&[
        kafka::METRICS,
        service_kit::http::METRICS,
        service_kit::periodic::METRICS,
        guard::METRICS,
    ]);
    outbox::describe_metrics();
    let mut sources = Vec::new();
    for url in &config.database_urls {
        let name = service_kit::db::database_name(url)?;
        // Whose outbox it is decides what the relay may send from it.
        let producer = contract::producers::of_database(&name).ok_or_else(|| {
            anyhow::anyhow!(
                "OUTBOX_DATABASE_URLS: database {name} is none of the saga's outboxes ({}, or <prefix>_ before one)",
                contract::producers::DATABASES.map(|(db, _)| db).join(", ")
            )
        })?;
        // One claiming transaction per batch in flight, the batch bookkeeping
        // beside a claim, the idle probe, and housekeeping.
        let connections = config.in_flight.max(1) as u32 + 3;
        let pool = service_kit::db::pool_lazy(url, connections)?;
        sources.push((name, producer, pool));
    }
    anyhow::ensure!(!sources.is_empty(), "OUTBOX_DATABASE_URLS names no database");
    let listener = TcpListener::bind(config.admin_addr).await?;
    Ok(App {
        sources,
        listener,
        config,
    })
}

impl App {
    /// The bound admin address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Relays every source until `shutdown`, or until one relay dies (then
    /// returns its error).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(sources = self.sources.len(), "outbox-relay running");
        let mut tasks = Supervisor::new(shutdown);
        // Started while Kafka is down, the relay waits, not ready, until a
        // broker answers and its topics are made sure of.
        let waiting = tasks.health().wait_for("kafka");
        let admin_pool = self.sources[0].2.clone();
        tasks.serve_admin(self.listener, service_kit::admin::router(&admin_pool, tasks.health()));
        if !self.config.kafka.ready_to_publish(&topics::ALL, tasks.token()).await? {
            return tasks.wait().await;
        }
        drop(waiting);
        let waiting = tasks.health().wait_for("the services' outbox tables");
        if !outboxes_readable(&self.sources, tasks.token()).await {
            return tasks.wait().await;
        }
        drop(waiting);
        let publisher =
            KafkaPublisher::from_producer(self.config.kafka.producer()?).trace_with(telemetry::propagation::link);
        for (name, producer, pool) in &self.sources {
            // Stamped with the source's service, and only its own messages sent.
            let publisher = guard::Guarded::new(publisher.clone().stamp_producer(producer), producer);
            let relay = Arc::new(
                Relay::new(pool.clone(), publisher, name)
                    .batch(self.config.batch)
                    .in_flight(self.config.in_flight)
                    .poll_interval(Duration::from_millis(self.config.poll_ms)),
            );
            let (r, token) = (relay.clone(), tasks.token());
            tasks.spawn(format!("relay {name}"), async move { r.run(token).await });
            // The backlog gauges every 5 s; published rows past retention purged every minute.
            let r = relay.clone();
            tasks.spawn_every(format!("relay {name} backlog"), Duration::from_secs(5), move || {
                let r = r.clone();
                async move { r.observe_backlog().await.map(drop) }
            });
            let retention = Duration::from_secs(self.config.retention_secs);
            tasks.spawn_purge(
                format!("relay {name} retention"),
                service_kit::periodic::PURGE_EVERY,
                relay.clone(),
                move |r, n| async move { r.purge_published(retention, n).await },
            );
        }
        tasks.wait().await
    }
}

/// Waits until the outbox of every source can be read — its database and
/// table created by the owning service, and the relay's role granted them —
/// retrying each second and saying every 10 s what it waits for. `false`
/// if `shutdown` came first.
async fn outboxes_readable(sources: &[(String, &'static str, PgPool)], shutdown: CancellationToken) -> bool {
    let mut said = None::<std::time::Instant>;
    loop {
        let mut missing = Vec::new();
        for (name, _, pool) in sources {
            if let Err(e) = sqlx::query("SELECT 1 FROM outbox LIMIT 0").execute(pool).await {
                missing.push(format!("{name}: {e}"));
            }
        }
        if missing.is_empty() {
            return true;
        }
        if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(waiting_for = ?missing, "an outbox cannot be read yet: waiting for its service");
            said = Some(std::time::Instant::now());
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every flag and variable has its own id (a second `linger_ms`, the
    /// relay's beside the producer's, once made the release binary refuse
    /// to start: clap's debug assertions are what catch it).
    #[test]
    fn the_configuration_is_well_formed() {
        use clap::CommandFactory as _;
        super::Config::command().debug_assert();
    }
}
