//! mock-gateway: a payment provider that behaves like Stripe where it matters
//! here — every `POST` needs an `Idempotency-Key`, a retried key returns the
//! original result, a key reused with other parameters is refused — and whose
//! ledger is the ground truth for "charged twice?".
//!
//! Declines: card `4000000000000002` is always declined (Stripe's test card
//! for a generic decline). Faults ([`faults`]) can be set at start from the
//! environment or at run time through `/admin/faults` when enabled.

pub mod faults;
pub mod ledger;
pub mod vault;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use service_kit::{DbArgs, LogArgs, Supervisor};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Process name, in logs and metrics.
pub const NAME: &str = "mock-gateway";

/// The card number that is always declined.
pub const DECLINED_CARD: &str = "4000000000000002";

/// mock-gateway configuration, from environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "mock-gateway",
    about = "Stripe-like payment gateway with a ledger and fault injection"
)]
#[command(mut_arg("url", |a| a.default_value("postgres://postgres@127.0.0.1:5432/gateway")))]
// A payment command may be redelivered for as long as payment-service's
// inbox remembers it (7 days by default): the gateway keeps keys longer.
#[command(mut_arg("ttl_secs", |a| a.default_value("691200")))]
pub struct Config {
    /// The `gateway` database.
    #[command(flatten)]
    pub db: DbArgs,
    /// HTTP address.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8083")]
    pub http_addr: SocketAddr,
    /// Enables `GET/PUT /admin/faults` (never in production).
    #[arg(long, env = "GATEWAY_ADMIN", default_value_t = false)]
    pub admin: bool,
    /// Idempotency-Key lifetime.
    #[command(flatten)]
    pub keys: idempotency::KeyArgs,
    /// Key of the vault's card fingerprints (HMAC-SHA256). Set a secret one
    /// outside development; changing it gives known cards new tokens.
    #[arg(
        long,
        env = "GATEWAY_VAULT_KEY",
        default_value = "development-vault-key",
        hide_default_value = true
    )]
    pub vault_key: String,
    /// Initial faults.
    #[command(flatten)]
    pub faults: faults::Faults,
    /// Negative control: Idempotency-Key ignored (test builds only).
    #[command(flatten)]
    pub unsafe_no_idempotency_key: service_kit::unsafe_switch::NoIdempotencyKey,
    /// Logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Handler state.
#[derive(Clone)]
pub struct AppState {
    /// The ledger database.
    pub pool: PgPool,
    /// Current faults.
    pub faults: Arc<faults::FaultSwitch>,
    /// How long a completed Idempotency-Key is remembered.
    pub key_ttl: Duration,
    /// Key of the vault's card fingerprints.
    pub vault_key: Arc<[u8]>,
}

/// The gateway's OpenAPI 3.1 document (`utoipa`), served at `/openapi.json`
/// and committed as docs/openapi/mock-gateway.json. The fault switch
/// (`/admin/faults`) is a test control and is left out.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "mock-gateway",
        description = "A Stripe-like payment provider for the effectively-once saga: every POST needs an Idempotency-Key; errors are RFC 9457 problem+json."
    ),
    paths(vault::create, ledger::charge, ledger::refund, ledger::operation, ledger::list),
    components(schemas(
        vault::TokenRequest,
        vault::CardToken,
        ledger::ChargeRequest,
        ledger::RefundRequest,
        ledger::Movement,
        ledger::LedgerEntry,
        ledger::EntryKind,
        ledger::EntryStatus,
        service_kit::problem::Problem
    ))
)]
pub struct ApiDoc;

/// The document as pretty JSON.
pub fn openapi_json() -> String {
    use utoipa::OpenApi as _;
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serialises")
}

/// A built gateway.
pub struct App {
    state: AppState,
    listener: TcpListener,
    admin: bool,
}

/// Connects, migrates and binds.
pub async fn build(config: Config) -> anyhow::Result<App> {
    config.unsafe_no_idempotency_key.apply()?;
    let pool = service_kit::db::connect(
        &config.db.url,
        config.db.pool_size,
        vec![idempotency::migrator(), sqlx::migrate!("../../migrations/gateway")],
    )
    .await?;
    let listener = TcpListener::bind(config.http_addr).await?;
    let state = AppState {
        pool,
        faults: Arc::new(faults::FaultSwitch::new(config.faults)),
        key_ttl: config.keys.ttl(),
        vault_key: Arc::from(config.vault_key.as_bytes()),
    };
    Ok(App {
        state,
        listener,
        admin: config.admin,
    })
}

impl App {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Serves until `shutdown`, or until a task dies (then returns its error).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), admin = self.admin, "mock-gateway listening");
        let mut tasks = Supervisor::new(shutdown);
        let mut api = Router::new()
            .route("/v1/charges", post(ledger::charge))
            .route("/v1/refunds", post(ledger::refund))
            .route("/v1/ledger", get(ledger::list))
            .route("/v1/tokens", post(vault::create))
            .route("/v1/operations/{key}", get(ledger::operation))
            .route(
                "/openapi.json",
                get(|| async { ([(axum::http::header::CONTENT_TYPE, "application/json")], openapi_json()) }),
            );
        if self.admin {
            api = api.route("/admin/faults", get(faults::get).put(faults::put));
        }
        tasks.spawn(
            "idempotency reaper",
            idempotency::run_reaper(self.state.pool.clone(), tasks.token()),
        );
        let app = api
            .with_state(self.state.clone())
            .merge(service_kit::admin::router(self.state.pool.clone(), tasks.health()));
        tasks.serve(self.listener, app);
        tasks.wait().await
    }
}

/// Starts a gateway on an ephemeral port over database `database_url`, with
/// the default settings, for tests and benches of its clients. Returns its
/// base URL; the gateway stops when `shutdown` is cancelled.
pub async fn start_local(database_url: &str, shutdown: CancellationToken) -> anyhow::Result<String> {
    use clap::Parser as _;
    let config = Config::try_parse_from([
        "mock-gateway",
        "--database-url",
        database_url,
        "--http-addr",
        "127.0.0.1:0",
    ])?;
    let app = build(config).await?;
    let base = format!("http://{}", app.local_addr());
    tokio::spawn(app.run(shutdown));
    Ok(base)
}
