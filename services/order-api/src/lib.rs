//! order-api: accepts orders over HTTP (with `Idempotency-Key`) and
//! orchestrates the order saga from the replies of inventory and payment.
//!
//! [`build`] connects, migrates and binds; [`App::run`] supervises the HTTP
//! server, the saga consumer and the reapers until the shutdown token is
//! cancelled or one of them dies. Tests start the real service on port 0.

pub mod admin;
pub mod audit;
pub mod auth;
pub mod gateway;
pub mod http;
pub mod journey;
pub mod notices;
pub mod orders;
pub mod saga;

use std::net::SocketAddr;
use std::time::Duration;

use contract::topics::consumers;
use saga_kit::SagaConsumer;
use service_kit::{DbArgs, LogArgs, Supervisor};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Process name, in logs and metrics.
pub const NAME: &str = "order-api";

/// The `orders` database when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/orders";

/// How long a finished order's saga history is kept unless
/// `ORDER_HISTORY_RETENTION_SECS` says otherwise: 90 days, in seconds.
pub const DEFAULT_HISTORY_RETENTION_SECS: u64 = 90 * 86_400;

/// order-api configuration, from arguments or environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "order-api", about = "Orders HTTP API and saga orchestrator")]
#[command(mut_arg("url", |a| a.default_value(DEFAULT_DATABASE_URL)))]
pub struct Config {
    /// The `orders` database.
    #[command(flatten)]
    pub db: DbArgs,
    /// The broker, the inbox retention and the negative controls.
    #[command(flatten)]
    pub saga: saga_kit::participant::ParticipantArgs,
    /// Address of the HTTP API.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// Address of the admin endpoints (`/health/*`, `/metrics`, `/openapi.json`): the
    /// orchestrator's probes and Prometheus, never published beside the API.
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9180")]
    pub admin_addr: SocketAddr,
    /// The HTTP port's limits: header and body read timeouts, connections at once.
    #[command(flatten)]
    pub http: service_kit::ServeArgs,
    /// Admission control on the API port: requests in flight, their deadline.
    #[command(flatten)]
    pub admission: http::admission::AdmissionArgs,
    /// Where an order's journey reads the participants' parts (their admin
    /// ports) and links its trace.
    #[command(flatten)]
    pub journey: journey::JourneyArgs,
    /// The operator's credential for the journey on the admin port.
    #[command(flatten)]
    pub access: service_kit::admin::AccessArgs,
    /// The payment gateway: its card vault (every new order's card number
    /// becomes a token there) and its record of operations (reconciliation);
    /// order-api's credential there.
    #[command(flatten)]
    pub gateway: gateway_client::GatewayArgs,
    /// Deadlines per saga state and the reconciler.
    #[command(flatten)]
    pub deadlines: saga::reconcile::DeadlineArgs,
    /// Confirmation notices: at-least-once or at-most-once, and how often.
    #[command(flatten)]
    pub notices: notices::NoticeArgs,
    /// API keys and per-client limits.
    #[command(flatten)]
    pub auth: auth::AuthArgs,
    /// Idempotency-Key lifetime.
    #[command(flatten)]
    pub keys: idempotency::KeyArgs,
    /// How long the saga history of a finished (CONFIRMED or CANCELLED)
    /// order is kept, in seconds; the order row itself stays.
    #[arg(long, env = "ORDER_HISTORY_RETENTION_SECS", default_value_t = DEFAULT_HISTORY_RETENTION_SECS)]
    pub history_retention_secs: u64,
    /// How long the audit trail keeps an event, in days (PCI DSS asks a
    /// year at least).
    #[arg(long, env = "AUDIT_RETENTION_DAYS", default_value_t = 400)]
    pub audit_retention_days: u64,
    /// Connections of the saga consumer's own pool. The consumer never
    /// queues behind `POST /orders` for a connection: sharing the one pool,
    /// the saga fell behind the intake it serves (measured:
    /// docs/results/code-decisions.md).
    #[arg(long, env = "SAGA_DATABASE_POOL_SIZE", default_value_t = 4)]
    pub saga_pool_size: u32,
    /// Logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    /// The `orders` database.
    pub pool: PgPool,
    /// Idempotency-Key lifetime.
    pub idempotency_ttl: Duration,
    /// The gateway (card vault, operation lookups).
    pub gateway: gateway::Client,
    /// API keys and per-client limits.
    pub auth: std::sync::Arc<auth::Auth>,
    /// Key of the Idempotency-Key request fingerprints.
    pub fingerprint_key: idempotency::FingerprintKey,
    /// The API port's places in flight and request deadline.
    pub admission: http::admission::Admission,
}

impl axum::extract::FromRef<AppState> for idempotency::FingerprintKey {
    fn from_ref(state: &AppState) -> Self {
        state.fingerprint_key.clone()
    }
}

/// A built, not yet running, order-api.
pub struct App {
    state: AppState,
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
}

/// Connects to the `orders` database, creating and migrating it (the
/// outbox, inbox and idempotency tables, then the orders schema).
pub async fn connect(database_url: &str, pool_size: u32) -> anyhow::Result<PgPool> {
    let own = vec![idempotency::migrator(), sqlx::migrate!("../../migrations/orders")];
    saga_kit::participant::connect(database_url, pool_size, own).await
}

/// The negative controls this service can run (`switches::Switches::install` refuses others).
pub const SWITCHES: [switches::Switch; 5] = [
    switches::Switch::NoInbox,
    switches::Switch::InboxSeparateTx,
    switches::Switch::NoIdempotencyKey,
    switches::Switch::OffsetBeforeHandling,
    switches::Switch::OutboxAfterCommit,
];

/// Connects to the database (creating and migrating it) and binds the HTTP
/// listener (the topics are made sure of when the consumer starts).
pub async fn build(config: Config) -> anyhow::Result<App> {
    config
        .saga
        .check(NAME, &SWITCHES, &[METRICS, gateway_client::METRICS], None)?;
    idempotency::describe_metrics();
    // The gateway's settings first: an http:// URL is refused before any connection.
    let gateway = gateway::Client::over(config.gateway.client()?);
    let pool = connect(&config.db.url, config.db.pool_size).await?;
    config.saga.grant_relay(&pool).await?;
    let listener = TcpListener::bind(config.http_addr).await?;
    let admin = TcpListener::bind(config.admin_addr).await?;
    let auth = auth::Auth::new(pool.clone(), config.auth.clone());
    let state = AppState {
        pool,
        idempotency_ttl: config.keys.ttl(),
        gateway,
        auth,
        fingerprint_key: config.keys.fingerprint_key(),
        admission: http::admission::Admission::new(&config.admission),
    };
    Ok(App {
        state,
        listener,
        admin,
        config,
    })
}

impl App {
    /// The bound HTTP address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// The bound admin address (useful with port 0).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr().expect("bound listener")
    }

    /// What the handlers share (a test reads its pool and its authentication).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves the orders API and runs the saga orchestrator (its consumer,
    /// the deadline scan), the key and history reapers and the card
    /// backfill until `shutdown`, or until one of them dies (then returns
    /// its error).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut tasks = Supervisor::new(shutdown);
        let config = &self.config;
        let saga_pool = service_kit::db::pool(&config.db.url, config.saga_pool_size).await?;
        let saga = SagaConsumer::new(consumers::ORDER_SAGA, &config.saga, &saga_pool);
        saga.spawn_batches(&mut tasks, saga_pool, |pool, envelopes| async move {
            saga::handle_batch(&pool, envelopes).await
        });
        let pool = self.state.pool.clone();
        tasks.spawn_purge(
            "idempotency reaper",
            service_kit::periodic::PURGE_EVERY,
            pool,
            idempotency::reap_from,
        );
        let (pool, audit_for) = (
            self.state.pool.clone(),
            Duration::from_secs(config.audit_retention_days.saturating_mul(86_400)),
        );
        tasks.spawn_purge(
            "audit retention",
            service_kit::periodic::PURGE_EVERY,
            pool,
            move |pool, n| async move { audit::purge(&mut *pool.acquire().await?, audit_for, n).await },
        );
        let (pool, retention) = (
            self.state.pool.clone(),
            Duration::from_secs(config.history_retention_secs),
        );
        tasks.spawn_purge(
            "history retention",
            service_kit::periodic::PURGE_EVERY,
            pool,
            move |pool, n| async move { orders::purge_history(&mut *pool.acquire().await?, retention, n).await },
        );

        let (pool, gateway, deadlines) = (
            self.state.pool.clone(),
            self.state.gateway.clone(),
            config.deadlines.clone(),
        );
        tasks.spawn_every(
            "deadlines",
            Duration::from_secs(deadlines.interval_secs.max(1)),
            move || {
                let (pool, gateway, deadlines) = (pool.clone(), gateway.clone(), deadlines.clone());
                async move { saga::reconcile::scan(&pool, &gateway, &deadlines).await }
            },
        );
        let (pool, gateway, notice_args) = (
            self.state.pool.clone(),
            self.state.gateway.clone(),
            config.notices.clone(),
        );
        tasks.spawn_every("notices", config.notices.interval(), move || {
            let (pool, gateway, args) = (pool.clone(), gateway.clone(), notice_args.clone());
            async move { notices::send_pending(&pool, &gateway, &args).await.map(|_| ()) }
        });
        tasks.spawn_once(
            "card backfill",
            orders::run_legacy_card_backfill(self.state.pool.clone(), self.state.gateway.clone(), tasks.token()),
        );
        // The public port: a client's traceparent is a link, not the parent.
        tasks.serve_public(
            self.listener,
            http::links::journey_links(
                http::router(self.state.clone()),
                self.config.journey.public_url.as_deref(),
            ),
            self.config.http.clone(),
        );
        let admin = http::admin_router(
            self.state.clone(),
            tasks.health(),
            self.config.journey.clone(),
            &self.config.access,
        );
        tasks.serve_admin(self.admin, admin);
        tasks.wait().await
    }
}

/// The metrics order-api records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "orders_created_total": "Orders created by POST /orders (replays not counted).",
    counter "saga_transitions_total": "Saga state changes, by from and to.",
    counter "saga_ignored_transitions_total": "Replies not legal in the order's state (stale, reordered, repeated).",
    counter "saga_unknown_order_total": "Replies for an order id this service never created.",
    histogram "saga_duration_seconds": "Placed to terminal (CONFIRMED or CANCELLED), by final status.",
    counter "saga_deadline_actions_total": "What the deadline scan did to an overdue order: reconciled, resent, manual_review or skipped.",
    counter "saga_replies_after_reconciliation_total": "Participant replies that arrived after reconciliation had taken the gateway's answer (set aside).",
    gauge "orders_manual_review": "Orders in MANUAL_REVIEW, waiting for a person.",
    counter "api_refusals_total": "Requests refused before their work: unauthenticated, lookup_limited, key_check_unavailable, too_large, rate_limited, or new_cards (a client's allowance of new cards spent).",
    counter "api_key_lookups_total": "API-key lookups that reached the database (a key neither cached nor known bad).",
    counter "api_key_lookups_avoided_total": "API-key lookups skipped: a key known not to exist, its lookup failed under a second ago, or the caller's address over its lookup limit.",
    counter "notices_sent_total": "Confirmation notices the notifier accepted, by delivery choice (a repeat after a crash counts again).",
    counter "notices_lost_total": "Confirmation notices marked sent whose send then failed (at-most-once only).",
];
