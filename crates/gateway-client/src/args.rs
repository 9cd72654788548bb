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
        default_value = "https://127.0.0.1:8083"
    )]
    pub url: String,
    /// PEM file of the certificate authorities that sign the gateway's
    /// certificate, trusted instead of the system's (a private CA).
    #[arg(id = "gateway_ca_file", long = "gateway-ca-file", env = "GATEWAY_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Accept a plain `http://` GATEWAY_URL — local development only: card
    /// numbers and this service's credential then travel in clear.
    #[arg(
        id = "gateway_allow_plaintext",
        long = "gateway-allow-plaintext",
        env = "GATEWAY_ALLOW_PLAINTEXT",
        default_value_t = false
    )]
    pub allow_plaintext: bool,
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

/// Why these settings make no gateway client.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// `http://` without `GATEWAY_ALLOW_PLAINTEXT`.
    #[error(
        "GATEWAY_URL {0} is plain http: card numbers and the gateway credential would travel in clear; \
         use https, or set GATEWAY_ALLOW_PLAINTEXT=true for local development"
    )]
    Plaintext(String),
    /// Neither `https://` nor `http://`.
    #[error("GATEWAY_URL {0} is not an https:// URL")]
    Scheme(String),
    /// `GATEWAY_CA_FILE` could not be read.
    #[error("GATEWAY_CA_FILE {path}: {error}")]
    CaFile {
        /// The file.
        path: String,
        /// What went wrong.
        error: std::io::Error,
    },
    /// The client could not be built.
    #[error("the gateway client: {0}")]
    Client(#[from] reqwest::Error),
}

impl GatewayArgs {
    /// The gateway client of these settings: `https://` (trusting
    /// `GATEWAY_CA_FILE`'s authorities when set), or `http://` only when
    /// `GATEWAY_ALLOW_PLAINTEXT` says so.
    pub fn client(&self) -> Result<crate::Client, ArgsError> {
        let url = self.url.as_str();
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("https") => {}
            Some("http") if self.allow_plaintext => {}
            Some("http") => return Err(ArgsError::Plaintext(url.to_owned())),
            _ => return Err(ArgsError::Scheme(url.to_owned())),
        }
        let key = self.api_key.expose();
        Ok(match &self.ca_file {
            Some(path) => {
                let ca_error = |error| ArgsError::CaFile {
                    path: path.display().to_string(),
                    error,
                };
                let pem = std::fs::read(path).map_err(ca_error)?;
                let roots = reqwest::Certificate::from_pem_bundle(&pem)
                    .ok()
                    .filter(|roots| !roots.is_empty())
                    .ok_or_else(|| ca_error(std::io::Error::other("no PEM certificate in the file")))?;
                crate::Client::with_roots(url, key, self.timeout(), roots)?
            }
            None => crate::Client::new(url, key, self.timeout())?,
        })
    }

    /// The timeout of one call.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::{ArgsError, GatewayArgs};

    fn args(url: &str) -> GatewayArgs {
        GatewayArgs {
            url: url.into(),
            ca_file: None,
            allow_plaintext: false,
            api_key: credentials::Secret::new(&"k".repeat(32)).unwrap(),
            timeout_ms: 1_000,
        }
    }

    /// Card numbers and the credential never go out in clear by accident:
    /// plain http only when allowed by name; https with or without a CA
    /// file; a CA file that cannot be read or holds no certificate is named.
    #[test]
    fn plain_http_is_refused_unless_allowed_and_the_ca_file_must_hold_a_certificate() {
        let refused = args("http://127.0.0.1:8083").client().err();
        assert!(matches!(refused, Some(ArgsError::Plaintext(_))), "{refused:?}");
        assert!(refused.unwrap().to_string().contains("GATEWAY_ALLOW_PLAINTEXT"));
        let refused = args("HTTP://127.0.0.1:8083").client().err();
        assert!(matches!(refused, Some(ArgsError::Plaintext(_))), "{refused:?}");
        assert!(matches!(
            args("127.0.0.1:8083").client().err(),
            Some(ArgsError::Scheme(_))
        ));
        assert!(GatewayArgs {
            allow_plaintext: true,
            ..args("http://127.0.0.1:8083")
        }
        .client()
        .is_ok());
        assert!(args("https://127.0.0.1:8083").client().is_ok());

        let dir = std::env::temp_dir().join(format!("eo-gateway-ca-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = GatewayArgs {
            ca_file: Some(dir.join("none.pem")),
            ..args("https://127.0.0.1:8083")
        };
        let err = missing.client().err().expect("a missing CA file");
        assert!(err.to_string().starts_with("GATEWAY_CA_FILE "), "{err}");
        std::fs::write(dir.join("empty.pem"), "not a certificate").unwrap();
        let empty = GatewayArgs {
            ca_file: Some(dir.join("empty.pem")),
            ..args("https://127.0.0.1:8083")
        };
        let err = empty.client().err().expect("a CA file with no certificate");
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
