//! A cluster with identities, as a deployment runs one: clients
//! authenticate with SASL/SCRAM-SHA-512 over TLS on the client listener
//! (the brokers replicate over it as the super user `broker`), controllers
//! talk mutual TLS, and the StandardAuthorizer allows a principal only what
//! an ACL grants it ([`super::acl`]). The SCRAM users are created when the
//! storage is formatted (`--add-scram`), so they exist before any node runs.

use std::path::{Path, PathBuf};

/// The inter-broker principal (a super user).
pub const BROKER_USER: &str = "broker";
/// The harness's and the operator's principal (a super user): audits,
/// injected copies, dead-letter tools, ACLs.
pub const ADMIN_USER: &str = "admin";
/// The common name of every node's certificate: the controller listener's
/// principal (`User:CN=kafka-node`, mutual TLS), a super user.
pub const NODE_CN: &str = "kafka-node";

/// A cluster's certificates and SCRAM users.
#[derive(Debug, Clone)]
pub struct Security {
    /// The CA every node's certificate is signed by (PEM): what clients trust.
    pub ca_file: PathBuf,
    /// Every node's private key and certificate, PEM, in one file (the
    /// nodes' keystore; one certificate for `localhost` and 127.0.0.1).
    pub keystore_file: PathBuf,
    /// SCRAM users and their passwords, [`BROKER_USER`] and [`ADMIN_USER`] first.
    users: Vec<(String, String)>,
}

impl Security {
    /// Writes the nodes' keystore (signed by `authority`) and the CA into
    /// `dir`, and gives [`BROKER_USER`], [`ADMIN_USER`] and each of `users`
    /// a random password.
    pub fn generate(dir: &Path, authority: &crate::tls::Authority, users: &[&str]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (cert, key) = authority.issue_as(NODE_CN, &["localhost", "127.0.0.1"])?;
        let (ca_file, keystore_file) = (dir.join("kafka-ca.pem"), dir.join("kafka-node.pem"));
        std::fs::write(&ca_file, &authority.cert_pem)?;
        std::fs::write(&keystore_file, format!("{key}{cert}"))?;
        let users = [BROKER_USER, ADMIN_USER]
            .iter()
            .chain(users)
            .map(|u| ((*u).to_owned(), random_password()))
            .collect();
        Ok(Self {
            ca_file,
            keystore_file,
            users,
        })
    }

    /// The password of `user`, if it is one of the cluster's.
    pub fn password(&self, user: &str) -> Option<&str> {
        self.users.iter().find(|(u, _)| u == user).map(|(_, p)| p.as_str())
    }

    /// The `server.properties` lines of a node: listeners (`CLIENT`:
    /// SASL_SSL, `CONTROLLER`: SSL with client certificates), the
    /// keystore and truststore (PEM), the authorizer and its super users.
    pub(super) fn properties(&self, port: u16, controller_port: u16, advertised_port: u16) -> String {
        let broker_password = self.password(BROKER_USER).unwrap_or_default();
        format!(
            "listeners=CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n\
             advertised.listeners=CLIENT://127.0.0.1:{advertised_port}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=CLIENT\n\
             listener.security.protocol.map=CLIENT:SASL_SSL,CONTROLLER:SSL\n\
             sasl.enabled.mechanisms=SCRAM-SHA-512\n\
             sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512\n\
             listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \
             required username=\"{BROKER_USER}\" password=\"{broker_password}\";\n\
             listener.name.controller.ssl.client.auth=required\n\
             ssl.keystore.type=PEM\n\
             ssl.keystore.location={keystore}\n\
             ssl.truststore.type=PEM\n\
             ssl.truststore.location={ca}\n\
             authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
             allow.everyone.if.no.acl.found=false\n\
             super.users=User:{BROKER_USER};User:{ADMIN_USER};User:CN={NODE_CN}\n",
            keystore = self.keystore_file.display(),
            ca = self.ca_file.display(),
        )
    }

    /// `kafka-storage format`'s arguments creating every SCRAM user.
    pub(super) fn scram_args(&self) -> Vec<String> {
        self.users
            .iter()
            .map(|(u, p)| format!("--add-scram=SCRAM-SHA-512=[name={u},password={p}]"))
            .collect()
    }
}

/// Two random UUIDs as 64 hex characters (244 random bits; a
/// `credentials::Secret` takes it).
fn random_password() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}
