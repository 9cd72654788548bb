//! The stack's Kafka identities: a SCRAM principal per service that talks
//! to the brokers, named as the service, and the ACLs that let each do its
//! part of the saga and nothing else (docs/operations.md's security model;
//! docker/kafka-init.sh creates the same in compose). The harness itself
//! is the super user `admin`: it reads the whole log for the audits and
//! writes the copies the chaos run injects.

use std::path::Path;

use contract::topics::{self, consumers, consumers::Consumer};
use testkit::broker::acl::{Acl, Operation, Resource};
use testkit::broker::Security;

use super::{Service, Stack};

/// The services that are Kafka clients, each with its own principal.
pub const CLIENTS: [Service; 4] = [Service::OrderApi, Service::Inventory, Service::Payment, Service::Relay];

/// Which consumer a service runs, if any.
fn consumer_of(s: Service) -> Option<Consumer> {
    match s {
        Service::OrderApi => Some(consumers::ORDER_SAGA),
        Service::Inventory => Some(consumers::INVENTORY),
        Service::Payment => Some(consumers::PAYMENT),
        _ => None,
    }
}

/// What a principal may do with a topic it makes sure of at start: create
/// it, read its partition count and settings, align its retention.
const TOPIC_UPKEEP: [Operation; 4] = [
    Operation::Create,
    Operation::Describe,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];

/// Every ACL of the stack, per principal:
/// - a consumer service reads its one topic in its own group and writes
///   that topic's dead letters;
/// - the relay writes the saga's three topics;
/// - each keeps up the topics it uses (create, describe, retention), no
///   others. Nobody but `admin` reads or writes anything else.
pub fn acls() -> Vec<Acl> {
    let mut acls = Vec::new();
    let mut allow = |s: Service, resource: Resource, ops: &[Operation]| {
        for op in ops {
            acls.push(Acl {
                principal: s.name().to_owned(),
                resource: resource.clone(),
                operation: *op,
            });
        }
    };
    for s in CLIENTS {
        if let Some(c) = consumer_of(s) {
            allow(s, Resource::Topic(c.topic.into()), &[Operation::Read]);
            allow(s, Resource::Topic(c.topic.into()), &TOPIC_UPKEEP);
            let dlq = kafka::dead_letter_topic(c.topic);
            allow(s, Resource::Topic(dlq.clone()), &[Operation::Write]);
            allow(s, Resource::Topic(dlq), &TOPIC_UPKEEP);
            allow(s, Resource::Group(c.name.into()), &[Operation::Read]);
        }
    }
    for t in topics::ALL {
        allow(Service::Relay, Resource::Topic(t.into()), &[Operation::Write]);
        allow(Service::Relay, Resource::Topic(t.into()), &TOPIC_UPKEEP);
    }
    acls
}

/// A cluster's certificates and a password per principal, in `dir`.
pub(super) fn security(dir: &Path, authority: &testkit::tls::Authority) -> anyhow::Result<Security> {
    let names: Vec<&str> = CLIENTS.iter().map(|s| s.name()).collect();
    Security::generate(dir, authority, &names)
}

impl Stack {
    /// The harness's Kafka settings: the brokers as the super user `admin`
    /// over SASL/SCRAM and TLS (audits, injected copies, tools).
    pub fn kafka(&self) -> kafka::KafkaArgs {
        self.kafka_as(testkit::broker::ADMIN_USER)
    }

    /// The brokers as `user` (a service's name, or `admin`).
    pub fn kafka_as(&self, user: &str) -> kafka::KafkaArgs {
        let password = self.tls.kafka.password(user).unwrap_or_default();
        let password = credentials::Secret::new(password).expect("the stack's passwords are 64 characters");
        let mut args = kafka::KafkaArgs::new(self.brokers()).with_sasl(user, password, &self.tls.kafka.ca_file);
        // The topics the harness makes are the services' kind.
        args.partitions = self.opts.partitions;
        args.replication_factor = super::replication_factor(self.broker_nodes.len());
        args
    }

    /// [`Stack::kafka`] as a file of `NAME=value` lines (the variables
    /// `cargo xtask dlq` reads), for an operator's shell.
    pub fn kafka_admin_env_file(&self) -> String {
        let user = testkit::broker::ADMIN_USER;
        format!(
            "KAFKA_BROKERS={}\nKAFKA_SASL_USERNAME={user}\nKAFKA_SASL_PASSWORD={}\nKAFKA_CA_FILE={}\n",
            self.brokers(),
            self.tls.kafka.password(user).unwrap_or_default(),
            self.tls.kafka.ca_file.display()
        )
    }

    /// librdkafka's settings for `admin`, for the harness's own clients.
    pub(super) fn kafka_admin_config(&self) -> rdkafka::ClientConfig {
        let mut config = kafka::Connect::client_config(&self.kafka());
        // Its waits ask until the brokers answer: no warning per refusal.
        config.set("log_level", "0");
        config
    }

    /// The Kafka settings of service `s`: its principal and the CA.
    pub(super) fn kafka_env(&self, s: Service) -> Vec<(String, String)> {
        if !CLIENTS.contains(&s) {
            return Vec::new();
        }
        let sec = &self.tls.kafka;
        vec![
            ("KAFKA_BROKERS".into(), self.brokers()),
            ("KAFKA_SASL_USERNAME".into(), s.name().into()),
            (
                "KAFKA_SASL_PASSWORD".into(),
                sec.password(s.name()).unwrap_or_default().into(),
            ),
            ("KAFKA_CA_FILE".into(), sec.ca_file.display().to_string()),
        ]
    }

    /// Creates [`acls`] on the running cluster (one admin request).
    pub(super) async fn create_acls(&self) -> anyhow::Result<()> {
        let config = self.kafka_admin_config();
        tokio::task::spawn_blocking(move || {
            testkit::broker::acl::create(&config, &acls(), std::time::Duration::from_secs(30))
        })
        .await?
    }
}
