//! Settings every service has, as `clap` argument groups. A service
//! flattens them into its own `Config`, so each variable appears in its
//! `--help` and is validated at start, and nothing reads the environment
//! behind the config's back.

/// The service's own database.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// PostgreSQL URL of the service's own database (created if missing).
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub url: String,
    /// Connections in the pool (opened on demand).
    #[arg(long = "database-pool-size", env = "DATABASE_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: u32,
}

/// Log output.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log filter in `tracing` syntax, e.g. `info` or `info,sqlx=warn`.
    #[arg(long = "log", env = "RUST_LOG", default_value = "info")]
    pub filter: String,
    /// `text` for people, `json` (one object per line) for log collectors.
    #[arg(long = "log-format", env = "LOG_FORMAT", value_enum, default_value_t)]
    pub format: LogFormat,
}

impl Default for LogArgs {
    fn default() -> Self {
        Self {
            filter: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}
