//! Settings every service has, as `clap` argument groups. A service
//! flattens them into its own `Config`, so each variable appears in its
//! `--help` and is validated at start, and nothing reads the environment
//! behind the config's back.

/// The service's own database.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// PostgreSQL URL of the service's own database (created if missing).
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
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
    /// Traces.
    #[command(flatten)]
    pub trace: TraceArgs,
}

impl Default for LogArgs {
    fn default() -> Self {
        Self {
            filter: "info".into(),
            format: LogFormat::Text,
            trace: TraceArgs::default(),
        }
    }
}

/// Where spans go. The standard OpenTelemetry variables, so a collector's
/// usual settings work unchanged.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// OTLP/HTTP endpoint (e.g. `http://127.0.0.1:4318`); spans are exported
    /// only when set. Trace ids are in the logs either way.
    #[arg(long = "otel-exporter-otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Fraction of new traces sampled, 0.0–1.0 (a trace started upstream
    /// keeps its parent's decision).
    #[arg(
        long = "otel-traces-sampler-arg",
        env = "OTEL_TRACES_SAMPLER_ARG",
        default_value_t = 1.0
    )]
    pub sample_ratio: f64,
    /// `true` drops OpenTelemetry altogether: no trace ids, no propagation.
    #[arg(long = "otel-sdk-disabled", env = "OTEL_SDK_DISABLED", default_value_t = false,
          action = clap::ArgAction::Set)]
    pub disabled: bool,
}

impl Default for TraceArgs {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            disabled: false,
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
