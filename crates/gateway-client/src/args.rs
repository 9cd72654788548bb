//! The gateway's address, this service's credential there and the call
//! timeout, as typed settings for a caller's configuration (feature `args`).

/// The payment gateway and this service's credential there.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// Base URL of the payment gateway.
    #[arg(
        id = "gateway_url",
        long = "gateway-url",
        env = "GATEWAY_URL",
        default_value = "http://127.0.0.1:8083"
    )]
    pub url: String,
    /// This service's credential at the gateway (`Authorization: Bearer`),
    /// ≥ 32 characters, no default.
    #[arg(
        id = "gateway_api_key",
        long = "gateway-api-key",
        env = "GATEWAY_API_KEY",
        value_name = "GATEWAY_API_KEY",
        hide_env_values = true
    )]
    pub api_key: credentials::Secret,
    /// Timeout of one gateway call, in milliseconds.
    #[arg(
        id = "gateway_timeout_ms",
        long = "gateway-timeout-ms",
        env = "GATEWAY_TIMEOUT_MS",
        default_value_t = 2_000
    )]
    pub timeout_ms: u64,
}

impl GatewayArgs {
    /// The timeout of one call.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms)
    }
}
