//! What a saga participant — a service whose database holds its outbox and
//! inbox and which consumes saga messages (order-api, inventory-service,
//! payment-service) — does before it runs, in one order for all of them.

use sqlx::migrate::Migrator;
use sqlx::PgPool;

/// The settings every participant has: flatten it into the service's
/// configuration (the flags and variables are the layers' own).
#[derive(Debug, Clone, clap::Args)]
pub struct ParticipantArgs {
    /// The broker.
    #[command(flatten)]
    pub kafka: kafka::KafkaArgs,
    /// Inbox retention.
    #[command(flatten)]
    pub inbox: inbox::RetentionArgs,
    /// Negative controls (test builds only): the layers this service can switch off.
    #[command(flatten)]
    pub switches: switches::Switches,
    /// The outbox relay's database role, granted at start what a relay does
    /// with this service's outbox and nothing else (`outbox::grant_relay`).
    /// Unset: no grant (the relay signs in as the tables' owner or a superuser).
    #[arg(long, env = "OUTBOX_RELAY_ROLE")]
    pub relay_role: Option<String>,
}

impl ParticipantArgs {
    /// What service `name` checks before it connects: refuses a broken
    /// retention chain ([`crate::retention::check_consumer`]; with
    /// `gateway_key_secs`, the lifetime of the gateway keys it sends) and
    /// switches other than the layers it can switch off (`known`) or this
    /// build has; describes its `metrics` and the layers' (kafka, outbox,
    /// HTTP). The saga's topics are created (or checked) when its consumer
    /// starts, once the broker answers ([`crate::consumer::SagaConsumer`]).
    pub fn check(
        &self,
        name: &'static str,
        known: &[switches::Switch],
        metrics: &[&'static [telemetry::metrics::Description]],
        gateway_key_secs: Option<u64>,
    ) -> anyhow::Result<()> {
        crate::retention::check_consumer(&self.kafka, &self.inbox, gateway_key_secs)?;
        self.switches.install(name, known)?;
        telemetry::metrics::describe(&[
            kafka::METRICS,
            crate::METRICS,
            service_kit::http::METRICS,
            service_kit::periodic::METRICS,
        ]);
        telemetry::metrics::describe(metrics);
        outbox::describe_metrics();
        Ok(())
    }

    /// Grants [`ParticipantArgs::relay_role`], when set, the relay's
    /// privileges on the outbox of `pool`'s database (after [`connect`]).
    pub async fn grant_relay(&self, pool: &PgPool) -> anyhow::Result<()> {
        if let Some(role) = &self.relay_role {
            outbox::grant_relay(pool, role)
                .await
                .map_err(|e| anyhow::anyhow!("granting the relay's role {role} its outbox privileges: {e}"))?;
        }
        Ok(())
    }
}

/// Connects to a participant's database, creating it and migrating the
/// outbox and inbox tables, then `own` (the service's schema) in order.
pub async fn connect(url: &str, pool_size: u32, own: Vec<Migrator>) -> anyhow::Result<PgPool> {
    let mut migrators = vec![outbox::migrator(), inbox::migrator()];
    migrators.extend(own);
    Ok(service_kit::db::connect(url, pool_size, migrators).await?)
}
