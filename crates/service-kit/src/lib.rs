//! The process plumbing every service shares (the saga's messaging glue is
//! `saga-kit`; this crate links no messaging crate), so each service's `lib.rs`
//! reads config → build → run and each `main.rs` stays a few lines:
//!
//! - [`config`]: the common settings as `clap` argument groups
//!   ([`DbArgs`], [`LogArgs`]) that services flatten into their `Config`;
//! - [`db`]: create the service's own database if missing, open the pool,
//!   run the migrators of every crate that owns a table in it;
//! - [`supervisor`]: the service's long-running tasks (HTTP server,
//!   consumers, reapers) under one cancellation token — the first task that
//!   dies turns the service not-ready, stops the others and makes the
//!   process exit non-zero;
//! - [`bearer`]: callers authenticated by configured secrets (the
//!   gateway's services, inventory's operator);
//! - [`admin`]: `/health/live`, `/health/ready` (database answers and every
//!   task alive) and `/metrics`;
//! - [`http`]: the server span of every request (W3C `traceparent` in);
//! - [`periodic`]: reapers, purges and scans — a step each period, deletes in
//!   bounded batches;
//! - [`problem`]: RFC 9457 `application/problem+json`, the error body of
//!   every HTTP API here;
//! - [`shutdown`]: SIGTERM / ctrl-c as a cancellation token;
//! - [`init`]: logging and the failpoint scenario, once per process.

pub mod admin;
pub mod bearer;
pub mod config;
pub mod db;
pub mod http;
pub mod periodic;
pub mod problem;
pub mod serve;
pub mod shutdown;
pub mod supervisor;

pub use config::{DbArgs, LogArgs, LogFormat, TraceArgs};
pub use credentials::{Scope, Secret};
pub use serve::ServeArgs;
pub use supervisor::{Health, Supervisor, Waiting};

/// Errors raised while bootstrapping a service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database URL could not be parsed.
    #[error("invalid database url {url:?}: {source}")]
    DatabaseUrl {
        /// The URL that was given.
        url: String,
        /// Why it was rejected.
        source: sqlx::Error,
    },
    /// Talking to PostgreSQL failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Held by `main` for the life of the process: the trace exporter (flushed
/// on drop) and the failpoint scenario (inert unless built with failpoints
/// and `FAILPOINTS` is set).
pub struct ProcessGuard {
    _telemetry: Option<telemetry::Guard>,
    _failpoints: fail::FailScenario<'static>,
}

/// How long a service's runtime waits, once `main`'s future has ended, for
/// blocking calls still in flight (librdkafka's, on the blocking pool)
/// before the process exits anyway.
pub const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Runs a service's `main` future on a multi-threaded runtime and returns
/// its result once the runtime is shut down — waiting at most
/// [`EXIT_GRACE`] for blocking calls still running. A plain
/// `#[tokio::main]` waits for them without end: a consumer that died while
/// a gauge's broker call held it kept the process alive after its
/// supervisor had stopped everything (seen: "inventory-service still running
/// after 30s" where it had logged "task died").
pub fn run_main<F>(main: F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(main);
    runtime.shutdown_timeout(EXIT_GRACE);
    result
}

/// Sets up a service process: logs and traces (as `log` says, tagged with
/// `service`) and the failpoint scenario. Call once, first thing in `main`.
pub fn init(service: &'static str, log: &LogArgs) -> ProcessGuard {
    let settings = telemetry::Settings {
        service,
        filter: log.filter.clone(),
        json: log.format == LogFormat::Json,
        otlp_endpoint: log.trace.otlp_endpoint.clone(),
        sample_ratio: log.trace.sample_ratio,
        disabled: log.trace.disabled,
    };
    let telemetry = match telemetry::init(&settings) {
        Ok(guard) => Some(guard),
        Err(e) => {
            eprintln!("{service}: tracing not set up: {e}");
            None
        }
    };
    ProcessGuard {
        _telemetry: telemetry,
        _failpoints: fail::FailScenario::setup(),
    }
}
