//! The stack's private CA: the gateway serves https with a certificate it
//! signs, and the gateway's callers (order-api, payment-service, the
//! drivers) trust it and nothing else for that hop; the Kafka nodes serve
//! TLS with another it signs.

use std::path::PathBuf;
use std::time::Duration;

use super::{Service, Stack};

/// The CA's certificate, the gateway's files and the Kafka nodes' (with
/// every principal's password), under `run_dir/tls`.
pub(super) struct StackTls {
    ca_pem: String,
    gateway: testkit::tls::ServerFiles,
    pub(super) kafka: testkit::broker::Security,
}

impl StackTls {
    /// A fresh CA, a loopback certificate for the gateway and one for the
    /// Kafka nodes, in `dir`.
    pub(super) fn generate(dir: PathBuf) -> anyhow::Result<Self> {
        let ca = testkit::tls::Authority::generate("effectively-once test CA")?;
        let gateway = ca.write_loopback(&dir, "mock-gateway")?;
        let kafka = super::kafka_identity::security(&dir, &ca)?;
        Ok(Self {
            ca_pem: ca.cert_pem,
            gateway,
            kafka,
        })
    }

    /// The TLS settings of `s`: the gateway's certificate, its callers' CA.
    pub(super) fn env(&self, s: Service) -> Vec<(String, String)> {
        let path = |p: &PathBuf| p.display().to_string();
        match s {
            Service::Gateway => vec![
                ("HTTP_TLS_CERT_FILE".into(), path(&self.gateway.cert)),
                ("HTTP_TLS_KEY_FILE".into(), path(&self.gateway.key)),
            ],
            Service::OrderApi | Service::Payment => vec![("GATEWAY_CA_FILE".into(), path(&self.gateway.ca))],
            _ => Vec::new(),
        }
    }
}

impl Stack {
    /// The stack CA's certificate (PEM), which signed the gateway's.
    pub fn ca_pem(&self) -> &str {
        &self.tls.ca_pem
    }

    /// The file of [`Stack::ca_pem`] (a tool's `--tls-verify`, say).
    pub fn ca_file(&self) -> &std::path::Path {
        &self.tls.gateway.ca
    }

    /// An HTTP client with `timeout` that trusts the stack's CA (besides
    /// the system's roots): for the gateway's https port.
    pub fn http_client(&self, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        Ok(reqwest::Client::builder()
            .timeout(timeout)
            .add_root_certificate(reqwest::Certificate::from_pem(self.tls.ca_pem.as_bytes())?)
            .build()?)
    }
}
