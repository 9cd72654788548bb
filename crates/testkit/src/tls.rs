//! A private certificate authority for a test stack: one CA, and server
//! certificates it signs for loopback names — what compose's `gen-env.sh`
//! makes with openssl, made here without a tool.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A certificate authority: its certificate (PEM) and what signs with it.
pub struct Authority {
    /// The CA certificate, PEM: what a client trusts.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A server certificate and its key, PEM, written to files beside the CA's.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    /// The CA's certificate (what a client trusts).
    pub ca: PathBuf,
    /// The certificate (`HTTP_TLS_CERT_FILE`).
    pub cert: PathBuf,
    /// Its private key (`HTTP_TLS_KEY_FILE`).
    pub key: PathBuf,
}

impl Authority {
    /// A fresh CA named `name`.
    pub fn generate(name: &str) -> anyhow::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert_pem = params.self_signed(&key)?.pem();
        Ok(Self {
            cert_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed
    /// by this CA: (certificate PEM, key PEM).
    pub fn issue(&self, names: &[&str]) -> anyhow::Result<(String, String)> {
        self.issue_as(names.first().copied().unwrap_or("server"), names)
    }

    /// [`Authority::issue`] with the common name `cn` (what a server that
    /// checks client certificates sees as the principal).
    pub fn issue_as(&self, cn: &str, names: &[&str]) -> anyhow::Result<(String, String)> {
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes `ca.pem` and a loopback server certificate for `server`
    /// (`<server>.pem`, `<server>-key.pem`, for `localhost` and 127.0.0.1)
    /// into `dir`.
    pub fn write_loopback(&self, dir: &Path, server: &str) -> anyhow::Result<ServerFiles> {
        std::fs::create_dir_all(dir)?;
        let (cert, key) = self.issue(&["localhost", "127.0.0.1"])?;
        let files = ServerFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{server}.pem")),
            key: dir.join(format!("{server}-key.pem")),
        };
        std::fs::write(&files.ca, &self.cert_pem)?;
        std::fs::write(&files.cert, cert)?;
        std::fs::write(&files.key, key)?;
        Ok(files)
    }
}
