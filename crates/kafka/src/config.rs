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
    /// How often consumers commit the offsets of handled messages, in
    /// milliseconds. A crash redelivers what was handled since the last
    /// commit; the inbox absorbs it. Shorter costs broker writes, longer
    /// costs redeliveries after a crash.
    #[arg(long = "kafka-commit-interval-ms", env = "KAFKA_COMMIT_INTERVAL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub commit_interval_ms: u64,
    /// Longest a fetch waits at the broker for data, in milliseconds
    /// (`fetch.wait.max.ms`). tansu 0.6 sleeps after every fetch — half of
    /// what is left of this wait, or all of it under 250 ms — even when the
    /// fetch found data, so every hop of the saga costs about this long; an
    /// idle consumer sends one fetch per wait. 25 ms trades ~40 idle fetches
    /// a second per consumer for a short hop. Apache Kafka answers as soon as
    /// data arrives: there, the librdkafka default (500) costs no latency.
    #[arg(long = "kafka-fetch-wait-ms", env = "KAFKA_FETCH_WAIT_MS", default_value_t = 25,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub fetch_wait_ms: u64,
    /// How long the producer waits to fill a batch, in milliseconds
    /// (`linger.ms`). Each produce request costs tansu a storage transaction:
    /// fewer, fuller requests cost it less; 0 sends every message at once.
    #[arg(long = "kafka-linger-ms", env = "KAFKA_LINGER_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub linger_ms: u64,
    /// Most messages of one partition a batching consumer (inventory, the
    /// order saga) applies in one database transaction. Batches form only
    /// when a partition's messages queue up behind its lane, so an idle
    /// consumer still handles each message as it comes.
    #[arg(long = "kafka-consumer-max-batch", env = "KAFKA_CONSUMER_MAX_BATCH", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1_000))]
    pub consumer_max_batch: u16,
    /// How long the broker keeps a message, in seconds: set as `retention.ms`
    /// on the topics a service creates. It bounds how late a message can be
    /// redelivered, so every inbox must keep its records longer
    /// (`INBOX_RETENTION_SECS` ≥ this + `REDELIVERY_MARGIN_SECS`).
    #[arg(long = "kafka-topic-retention-secs", env = "KAFKA_TOPIC_RETENTION_SECS", default_value_t = 3 * 86_400,
          value_parser = clap::value_parser!(u64).range(60..))]
    pub topic_retention_secs: u64,
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
            commit_interval_ms: 1000,
            fetch_wait_ms: 25,
            linger_ms: 0,
            consumer_max_batch: 32,
            topic_retention_secs: 3 * 86_400,
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

    /// The broker's retention of the saga's topics.
    pub fn topic_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.topic_retention_secs)
    }

    /// Creates the topics (and their dead-letter topics) that are missing,
    /// with this retention.
    pub async fn ensure_topics(&self, topics: &[&str]) -> crate::Result<()> {
        crate::client::ensure_topics_retained(&self.brokers, topics, Some(self.topic_retention())).await
    }

    /// The idempotent producer for these settings (delivery timeout 15 s).
    pub fn producer(&self) -> crate::Result<rdkafka::producer::FutureProducer> {
        let mut config = self.client_config();
        config.set("linger.ms", self.linger_ms.to_string());
        crate::client::idempotent_producer(config, std::time::Duration::from_secs(15))
    }
}
