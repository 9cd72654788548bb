//! The process plumbing shared by every service, so each `main.rs` stays thin:
//! connect to (and create) the service's own database, run its migrations,
//! turn SIGTERM / ctrl-c into one cancellation token, and serve the admin
//! endpoints (`/health/live`, `/health/ready`, `/metrics`).

pub mod admin;
pub mod db;
pub mod problem;
pub mod shutdown;

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
    /// Binding or serving a socket failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
