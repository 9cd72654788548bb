//! mock-gateway: a payment provider that behaves like Stripe where it matters
//! here — every `POST` needs an `Idempotency-Key`, a retried key returns the
//! original result, a key reused with other parameters is refused — and whose
//! ledger is the ground truth for "charged twice?". It also plays a second
//! provider, a notifier ([`notices`]), that takes no key at all.
//!
//! Every `/v1` route authenticates its caller (`Authorization: Bearer`, one
//! configured secret per calling service, `GATEWAY_CLIENTS`): the caller is
//! the scope of its Idempotency-Keys and the owner of its operations; a
//! caller reads another's operations only when `GATEWAY_READERS` grants it.
//!
//! Declines: card `4000000000000002` is always declined (Stripe's test card
//! for a generic decline). Faults ([`faults`]) can be set at start from the
//! environment or at run time through `/admin/faults` — in builds with the
//! `failpoints` feature only: a production build refuses to start with them.

pub mod faults;
pub mod grants;
pub mod ledger;
pub mod notices;
pub mod vault;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use axum::routing::{get, post};
use axum::Router;
use idempotency::FingerprintKey;
use service_kit::bearer::Callers;
use service_kit::bearer::CALLER_SCHEME;
use service_kit::{DbArgs, LogArgs, Secret, Supervisor};
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
    /// Address of the admin endpoints (`/health/*`, `/metrics`,
    /// `/openapi.json`): the orchestrator's probes and Prometheus, never
    /// published beside the API.
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9183")]
    pub admin_addr: SocketAddr,
    /// The HTTP port's limits: header and body read timeouts, connections at once.
    #[command(flatten)]
    pub http: service_kit::ServeArgs,
    /// The callers and their secrets, `name=secret[,name=secret…]`, e.g.
    /// `order-api=…,payment-service=…` (each secret ≥ 32 characters).
    #[arg(
        long,
        env = "GATEWAY_CLIENTS",
        value_name = "GATEWAY_CLIENTS",
        hide_env_values = true
    )]
    pub clients: Callers,
    /// Which caller may read which other caller's operations,
    /// `reader=owner[,…]`, e.g. `order-api=payment-service` (order-api's
    /// reconciliation asks what payment-service's keys did).
    #[arg(long, env = "GATEWAY_READERS", default_value = "")]
    pub readers: Readers,
    /// What each caller may do, `caller=permission+permission[,…]`
    /// (permissions: tokenise, charge, refund, read, notify); a request on a
    /// route its caller has no grant for is refused with a 403.
    #[arg(long, env = "GATEWAY_GRANTS", default_value = grants::DEFAULT)]
    pub grants: grants::Grants,
    /// Cards each caller may tokenise per second (bursts up to twice
    /// that); past it a 429 with `Retry-After`, counted in
    /// `gateway_tokenise_limited_total{caller}`: a caller turning card
    /// numbers into tokens that fast is testing cards, not taking orders.
    #[arg(long, env = "GATEWAY_TOKENISE_PER_SEC", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tokenise_per_sec: u32,
    /// Enables `GET/PUT /admin/faults` (builds with failpoints only).
    #[arg(long, env = "GATEWAY_ADMIN", default_value_t = false)]
    pub admin: bool,
    /// Idempotency-Key lifetime.
    #[command(flatten)]
    pub keys: idempotency::KeyArgs,
    /// Key of the vault's card fingerprints (HMAC-SHA256), no default. To
    /// rotate it, set the old one as `GATEWAY_VAULT_KEY_PREVIOUS`: a known
    /// card keeps its token (its fingerprint is re-keyed when it is next
    /// seen); without it, a change gives known cards new tokens.
    #[arg(
        long,
        env = "GATEWAY_VAULT_KEY",
        value_name = "GATEWAY_VAULT_KEY",
        hide_env_values = true
    )]
    pub vault_key: Secret,
    /// The vault key before the last rotation, while cards fingerprinted
    /// under it may still come.
    #[arg(
        long,
        env = "GATEWAY_VAULT_KEY_PREVIOUS",
        value_name = "GATEWAY_VAULT_KEY_PREVIOUS",
        hide_env_values = true
    )]
    pub previous_vault_key: Option<Secret>,
    /// Initial faults.
    #[command(flatten)]
    pub faults: faults::Faults,
    /// Negative controls (test builds only): the layers this service can switch off.
    #[command(flatten)]
    pub switches: switches::Switches,
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
    pub vault_key: Secret,
    /// The one before it, while it is rotated.
    pub previous_vault_key: Option<Secret>,
    /// Key of the Idempotency-Key request fingerprints.
    pub fingerprint_key: FingerprintKey,
    /// Who may read whose operations.
    pub readers: Readers,
    /// Tokenisations per caller.
    pub tokenise_limit: Arc<vault::Limiter>,
}

impl FromRef<AppState> for FingerprintKey {
    fn from_ref(state: &AppState) -> Self {
        state.fingerprint_key.clone()
    }
}

/// Read grants: `reader=owner` pairs. A caller always reads its own
/// operations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readers(Arc<Vec<(String, String)>>);

impl Readers {
    /// Whether `reader` may read `owner`'s operations.
    pub fn may_read(&self, reader: &str, owner: &str) -> bool {
        reader == owner || self.0.iter().any(|(r, o)| r == reader && o == owner)
    }
}

impl std::str::FromStr for Readers {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let pairs = s
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.split_once('=')
                    .filter(|(r, o)| !r.is_empty() && !o.is_empty())
                    .map(|(r, o)| (r.to_owned(), o.to_owned()))
                    .ok_or_else(|| format!("{p:?}: each grant is reader=owner"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(Arc::new(pairs)))
    }
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
    paths(
        vault::create,
        ledger::charge,
        ledger::refund,
        ledger::operation,
        ledger::list,
        notices::create
    ),
    modifiers(&CALLER_SCHEME),
    security(("bearer" = [])),
    components(schemas(
        vault::TokenRequest,
        notices::NoticeRequest,
        vault::CardToken,
        ledger::ChargeRequest,
        ledger::RefundRequest,
        ledger::Movement,
        ledger::LedgerEntry,
        ledger::LedgerPage,
        ledger::EntryKind,
        ledger::EntryStatus,
        service_kit::problem::Problem
    ))
)]
pub struct ApiDoc;

/// The document as pretty JSON.
pub fn openapi_json() -> String {
    service_kit::http::openapi_json::<ApiDoc>()
}

/// A built gateway.
pub struct App {
    state: AppState,
    listener: TcpListener,
    admin_listener: TcpListener,
    admin: bool,
    callers: Callers,
    grants: grants::Grants,
    limits: service_kit::ServeArgs,
}

/// Connects, migrates and binds.
pub async fn build(config: Config) -> anyhow::Result<App> {
    telemetry::metrics::describe(&[METRICS, service_kit::http::METRICS, service_kit::periodic::METRICS]);
    idempotency::describe_metrics();
    config
        .switches
        .install("mock-gateway", &[switches::Switch::NoIdempotencyKey])?;
    // Fault injection exists only in test builds.
    switches::test_builds_only("GATEWAY_ADMIN", config.admin)?;
    switches::test_builds_only("GATEWAY_* faults", config.faults.any())?;
    let pool = service_kit::db::connect(
        &config.db.url,
        config.db.pool_size,
        vec![idempotency::migrator(), sqlx::migrate!("../../migrations/gateway")],
    )
    .await?;
    let listener = TcpListener::bind(config.http_addr).await?;
    let admin_listener = TcpListener::bind(config.admin_addr).await?;
    let state = AppState {
        pool,
        faults: Arc::new(faults::FaultSwitch::new(config.faults)),
        key_ttl: config.keys.ttl(),
        vault_key: config.vault_key,
        previous_vault_key: config.previous_vault_key,
        fingerprint_key: config.keys.fingerprint_key(),
        readers: config.readers,
        tokenise_limit: Arc::new(vault::limiter(config.tokenise_per_sec)),
    };
    Ok(App {
        state,
        listener,
        admin_listener,
        admin: config.admin,
        callers: config.clients,
        grants: config.grants,
        limits: config.http,
    })
}

impl App {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener.local_addr().expect("bound listener")
    }

    /// Serves until `shutdown`, or until a task dies (then returns its error).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(admin = self.admin, callers = ?self.callers, grants = ?self.grants, "mock-gateway callers");
        let mut tasks = Supervisor::new(shutdown);
        use grants::Permission;
        let granted = |what: Permission, routes: Router<AppState>| {
            routes.route_layer(axum::middleware::from_fn_with_state(
                (self.grants.clone(), what),
                grants::require,
            ))
        };
        let mut api = Router::new()
            .merge(granted(
                Permission::Charge,
                Router::new().route("/v1/charges", post(ledger::charge)),
            ))
            .merge(granted(
                Permission::Refund,
                Router::new().route("/v1/refunds", post(ledger::refund)),
            ))
            .merge(granted(
                Permission::Tokenise,
                Router::new().route("/v1/tokens", post(vault::create)),
            ))
            .merge(granted(
                Permission::Notify,
                Router::new().route("/v1/notices", post(notices::create)),
            ))
            .merge(granted(
                Permission::Read,
                Router::new()
                    .route("/v1/ledger", get(ledger::list))
                    .route("/v1/operations/{key}", get(ledger::operation)),
            ));
        if self.admin {
            api = api.route("/admin/faults", get(faults::get).put(faults::put));
        }
        let api = api.route_layer(axum::middleware::from_fn_with_state(
            self.callers.clone(),
            service_kit::bearer::require,
        ));
        let pool = self.state.pool.clone();
        tasks.spawn_purge(
            "idempotency reaper",
            service_kit::periodic::PURGE_EVERY,
            pool,
            idempotency::reap_from,
        );
        // How many cards still depend on the previous vault key.
        let state = self.state.clone();
        tasks.spawn_every("vault keys", service_kit::periodic::PURGE_EVERY, move || {
            let state = state.clone();
            async move {
                let previous = state.previous_vault_key.as_ref().map(|k| k.expose().as_bytes());
                let by = vault::cards_by_key(&state.pool, state.vault_key.expose().as_bytes(), previous).await?;
                for (key, n) in [("current", by.current), ("previous", by.previous), ("other", by.other)] {
                    telemetry::metrics::set("vault_cards", &[("key", key)], n as f64);
                }
                Ok::<_, sqlx::Error>(())
            }
        });
        let admin = service_kit::admin::router(&self.state.pool, tasks.health())
            .route("/openapi.json", service_kit::http::openapi_route::<(), ApiDoc>());
        tasks.serve(self.listener, api.with_state(self.state.clone()), self.limits);
        tasks.serve_admin(self.admin_listener, admin);
        tasks.wait().await
    }
}

/// A gateway started by [`start_local`]: its URL and its callers' secrets.
#[derive(Debug, Clone)]
pub struct LocalGateway {
    /// Base URL.
    pub url: String,
    /// order-api's credential.
    pub order_api_key: Secret,
    /// payment-service's credential.
    pub payment_key: Secret,
}

/// A random secret (64 hex characters).
pub fn random_secret() -> Secret {
    use rand::RngCore as _;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    Secret::new(&hex::encode(bytes)).expect("64 characters")
}

/// Starts a gateway on an ephemeral port over database `database_url`, with
/// the default settings and random secrets for order-api and
/// payment-service (order-api may read payment-service's operations), for
/// tests and benches of its clients. The gateway stops when `shutdown` is
/// cancelled.
pub async fn start_local(database_url: &str, shutdown: CancellationToken) -> anyhow::Result<LocalGateway> {
    use clap::Parser as _;
    let (order_api_key, payment_key) = (random_secret(), random_secret());
    let clients = format!(
        "order-api={},payment-service={}",
        order_api_key.expose(),
        payment_key.expose()
    );
    let (vault, fingerprint) = (random_secret(), random_secret());
    let config = Config::try_parse_from([
        "mock-gateway",
        "--database-url",
        database_url,
        "--http-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
        "--clients",
        &clients,
        "--readers",
        "order-api=payment-service",
        "--vault-key",
        vault.expose(),
        "--idempotency-fingerprint-key",
        fingerprint.expose(),
    ])?;
    let app = build(config).await?;
    let url = format!("http://{}", app.local_addr());
    tokio::spawn(app.run(shutdown));
    Ok(LocalGateway {
        url,
        order_api_key,
        payment_key,
    })
}

/// The metrics mock-gateway records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "gateway_charges_total": "Charges the mock gateway executed.",
    counter "gateway_refunds_total": "Refunds the mock gateway executed.",
    counter "gateway_injected_faults_total": "Faults the mock gateway injected on purpose.",
    counter "gateway_tokens_issued_total": "Card tokens the vault answered (new or existing).",
    counter "gateway_tokenise_limited_total": "Tokenisations refused as faster than GATEWAY_TOKENISE_PER_SEC, per caller.",
    counter "gateway_notices_received_total": "Notices the notifier received (no key: every request is one more notice).",
    counter "gateway_operation_lookups_total": "Reconciliation lookups of an operation by its key, by whether one was found.",
    gauge "vault_cards": "Cards the vault holds, by the key their fingerprint was made under (current, previous, other): GATEWAY_VAULT_KEY_PREVIOUS may be retired at previous = 0.",
];
