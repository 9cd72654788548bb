//! The Kafka settings of a service, as typed command-line/environment
//! arguments. A service flattens [`KafkaArgs`] into its own `Config`, so
//! every variable shows in its `--help` and nothing reads the environment
//! behind the config's back.

use rdkafka::config::ClientConfig;

/// How partitions are given to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Assignment {
    /// Take every partition of the topics (`assign`), reading and committing
    /// the group's offsets without joining the group. A restarted or second
    /// instance starts consuming at once, with no rebalance to wait for; two
    /// instances both consume everything and the inbox decides. The default,
    /// because tansu's group coordinator does not reliably recover when a
    /// member is SIGKILLed mid-join.
    #[default]
    Static,
    /// Join the consumer group (`subscribe`) and let the broker balance the
    /// partitions — the choice for Apache Kafka with several instances.
    Group,
}

/// Kafka settings shared by every service.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers (comma-separated host:port).
    #[arg(long = "kafka-brokers", env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// How consumers get their partitions: `static` (assign all) or `group`.
    #[arg(long = "kafka-assignment", env = "KAFKA_ASSIGNMENT", value_enum, default_value_t)]
    pub assignment: Assignment,
    /// librdkafka debug contexts (e.g. `cgrp,fetch`), for diagnosing a broker.
    #[arg(long = "kafka-debug", env = "KAFKA_DEBUG")]
    pub debug: Option<String>,
}

impl KafkaArgs {
    /// Settings for `brokers` with every other value at its default.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            assignment: Assignment::default(),
            debug: None,
        }
    }

    /// The base client configuration for these settings.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = crate::client_config(&self.brokers);
        if let Some(debug) = &self.debug {
            c.set("debug", debug).set("log_level", "7");
        }
        c
    }

    /// The idempotent producer for these settings (delivery timeout 15 s).
    pub fn producer(&self) -> crate::Result<rdkafka::producer::FutureProducer> {
        crate::client::idempotent_producer(self.client_config(), std::time::Duration::from_secs(15))
    }
}
