//! The Kafka settings of a service, as typed command-line/environment
//! arguments. A service flattens [`KafkaArgs`] into its own `Config`, so
//! every variable shows in its `--help` and nothing reads the environment
//! behind the config's back.

use std::path::PathBuf;

use credentials::Secret;
use rdkafka::config::ClientConfig;

/// Kafka settings shared by every service.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers (comma-separated host:port).
    #[arg(long = "kafka-brokers", env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// How often consumers commit the offsets of handled messages, in
    /// milliseconds. A crash redelivers what was handled since the last
    /// commit; the inbox absorbs it. Shorter costs broker writes, longer
    /// costs redeliveries after a crash.
    #[arg(long = "kafka-commit-interval-ms", env = "KAFKA_COMMIT_INTERVAL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub commit_interval_ms: u64,
    /// How long the producer waits to fill a batch, in milliseconds
    /// (`linger.ms`). 0 sends every message at once (the shortest hop);
    /// batches still form while requests are in flight. Raise it to trade
    /// latency for fewer, fuller produce requests.
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
    /// Attempts a consumer makes at a message that keeps failing
    /// transiently (not a dependency down: that waits without limit) before
    /// it dead-letters the message with the last error and moves on: a
    /// deterministic failure must not stall its partition for ever. With
    /// the backoff (50 ms doubling to 5 s), 10 attempts take about 16 s.
    #[arg(long = "kafka-consumer-max-attempts", env = "KAFKA_CONSUMER_MAX_ATTEMPTS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub consumer_max_attempts: u32,
    /// Lives a message may kill before it is dead-lettered: a message whose
    /// handling aborts the process (it never returns an error, so the
    /// attempts above die with it) is counted in the metadata of the
    /// group's committed offset, and the consumer that starts on it for
    /// the last time sends it to the dead-letter topic instead of dying
    /// again (`kafka::consumer::crashes`).
    #[arg(long = "kafka-consumer-max-crashes", env = "KAFKA_CONSUMER_MAX_CRASHES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub consumer_max_crashes: u32,
    /// How long a consumer's fetch may wait at the broker for more messages
    /// to arrive, in milliseconds (`fetch.wait.max.ms`, with
    /// `fetch.min.bytes` of 16 KiB): a fetch answered at the first message
    /// makes batches of one — a database transaction and a fetch request per
    /// message; a short wait gathers them, for up to this much more latency
    /// per hop. 0 (the default) leaves librdkafka's long poll, answered at
    /// the first message: 10 ms bought no throughput and raised p99 latency
    /// (measured: docs/results/code-decisions.md).
    #[arg(long = "kafka-fetch-wait-ms", env = "KAFKA_FETCH_WAIT_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=500))]
    pub fetch_wait_ms: u64,
    /// How long the broker keeps a message, in seconds: set as `retention.ms`
    /// on the topics a service creates. It bounds how late a message can be
    /// redelivered, so every inbox must keep its records longer
    /// (`INBOX_RETENTION_SECS` ≥ this + `REDELIVERY_MARGIN_SECS`).
    #[arg(long = "kafka-topic-retention-secs", env = "KAFKA_TOPIC_RETENTION_SECS", default_value_t = 3 * 86_400,
          value_parser = clap::value_parser!(u64).range(60..))]
    pub topic_retention_secs: u64,
    /// Replicas of each topic a service creates (`replication.factor`);
    /// with more than one, `min.insync.replicas` is one less (2 of 3), so an
    /// acknowledged (`acks=all`) message survives the loss of any one
    /// broker. 1 for a single local broker; 3 in production
    /// (docs/operations.md).
    #[arg(long = "kafka-replication-factor", env = "KAFKA_REPLICATION_FACTOR", default_value_t = 1,
          value_parser = clap::value_parser!(i32).range(1..=16))]
    pub replication_factor: i32,
    /// Partitions of each topic a service creates: the most consumer
    /// instances of one group that share a topic's work, and the ordering
    /// unit's spread (an order's messages stay in one partition by key).
    /// Chosen before the first start: a service refuses a topic with
    /// another count and never changes one (adding partitions moves keys,
    /// so an order's next message could overtake its earlier ones). Size
    /// it for the instances a deployment will ever run (docs/scaling.md).
    #[arg(long = "kafka-partitions", env = "KAFKA_PARTITIONS", default_value_t = crate::PARTITIONS,
          value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub partitions: i32,
    /// This instance's static identity in its consumer groups
    /// (`group.instance.id`, KIP-345), e.g. a StatefulSet pod name; unset,
    /// the instance is a dynamic member. A static member that restarts
    /// within the session timeout takes its partitions back at once,
    /// without a rebalance; a dynamic one joins as a new member and the
    /// partitions of the old one wait for its session to expire (10 s).
    /// Two running instances must never share one.
    #[arg(long = "kafka-group-instance-id", env = "KAFKA_GROUP_INSTANCE_ID")]
    pub group_instance_id: Option<String>,
    /// librdkafka debug contexts (e.g. `cgrp,fetch`), for diagnosing a broker.
    #[arg(long = "kafka-debug", env = "KAFKA_DEBUG")]
    pub debug: Option<String>,
    /// Connect without identity or encryption: anything that reaches the
    /// brokers' port may read and write every topic. For a local
    /// development broker only. Unset, the service authenticates as its
    /// own principal (SASL/SCRAM-SHA-512 over TLS) and the brokers' ACLs
    /// decide what it may read and write.
    #[arg(
        id = "kafka_plaintext",
        long = "kafka-plaintext",
        env = "KAFKA_PLAINTEXT",
        default_value_t = false
    )]
    pub plaintext: bool,
    /// This service's principal: its SCRAM user name (required unless
    /// `KAFKA_PLAINTEXT`).
    #[arg(
        long = "kafka-sasl-username",
        env = "KAFKA_SASL_USERNAME",
        value_name = "KAFKA_SASL_USERNAME",
        required_unless_present = "kafka_plaintext",
        conflicts_with = "kafka_plaintext"
    )]
    pub sasl_username: Option<String>,
    /// The principal's SCRAM password (required unless `KAFKA_PLAINTEXT`;
    /// at least 32 characters, never printed).
    #[arg(
        long = "kafka-sasl-password",
        env = "KAFKA_SASL_PASSWORD",
        value_name = "KAFKA_SASL_PASSWORD",
        hide_env_values = true,
        required_unless_present = "kafka_plaintext",
        conflicts_with = "kafka_plaintext"
    )]
    pub sasl_password: Option<Secret>,
    /// PEM file of the CA the brokers' certificates are signed by
    /// (`ssl.ca.location`); unset, the system's roots. The broker's name
    /// is verified against its certificate either way.
    #[arg(long = "kafka-ca-file", env = "KAFKA_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

impl KafkaArgs {
    /// Settings for `brokers` with every other value at its default, as a
    /// plaintext client (a local broker: library tests, examples); see
    /// [`KafkaArgs::with_sasl`] for a principal.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            commit_interval_ms: 1000,
            linger_ms: 0,
            consumer_max_batch: 32,
            consumer_max_attempts: 10,
            consumer_max_crashes: 3,
            fetch_wait_ms: 0,
            topic_retention_secs: 3 * 86_400,
            replication_factor: 1,
            partitions: crate::PARTITIONS,
            group_instance_id: None,
            debug: None,
            plaintext: true,
            sasl_username: None,
            sasl_password: None,
            ca_file: None,
        }
    }

    /// These settings as `user` over SASL/SCRAM-SHA-512 and TLS, trusting
    /// the CA in `ca_file`.
    pub fn with_sasl(mut self, user: impl Into<String>, password: Secret, ca_file: impl Into<PathBuf>) -> Self {
        self.plaintext = false;
        self.sasl_username = Some(user.into());
        self.sasl_password = Some(password);
        self.ca_file = Some(ca_file.into());
        self
    }

    /// The `security.*`, `sasl.*` and `ssl.*` settings, added to `config`
    /// (none with [`KafkaArgs::plaintext`]).
    pub fn set_security(&self, config: &mut ClientConfig) {
        if self.plaintext {
            return;
        }
        config
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanisms", "SCRAM-SHA-512")
            .set("ssl.endpoint.identification.algorithm", "https");
        if let Some(user) = &self.sasl_username {
            config.set("sasl.username", user);
        }
        if let Some(password) = &self.sasl_password {
            config.set("sasl.password", password.expose());
        }
        if let Some(ca) = &self.ca_file {
            config.set("ssl.ca.location", ca.display().to_string());
        }
    }

    /// A consumer's fetch wait ([`Self::fetch_wait_ms`]): with 0, librdkafka's
    /// long poll, answered at the first byte (`fetch.min.bytes` 1).
    pub fn set_fetch_wait(&self, config: &mut ClientConfig) {
        if self.fetch_wait_ms > 0 {
            config
                .set("fetch.wait.max.ms", self.fetch_wait_ms.to_string())
                .set("fetch.min.bytes", "16384");
        }
    }

    /// The base client configuration for these settings.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = crate::client_config(&self.brokers);
        self.set_security(&mut c);
        if let Some(debug) = &self.debug {
            c.set("debug", debug).set("log_level", "7");
        }
        c
    }

    /// The broker's retention of the saga's topics.
    pub fn topic_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.topic_retention_secs)
    }

    /// The settings every topic of the saga must have.
    pub fn topic_settings(&self) -> crate::client::TopicSettings {
        crate::client::TopicSettings {
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            retention: Some(self.topic_retention()),
        }
    }

    /// Creates the topics (and their dead-letter topics) that are missing,
    /// and checks those that exist: a different retention is altered to
    /// this one, a different partition count is refused
    /// ([`crate::client::ensure_topics_with`]).
    pub async fn ensure_topics(&self, topics: &[&str]) -> crate::Result<()> {
        crate::client::ensure_topics_with(self, topics, &self.topic_settings()).await
    }

    /// Resolves once a broker answers a metadata request, asking every
    /// second; `false` if `shutdown` comes first. A service started while
    /// Kafka is down waits on this, not ready, instead of exiting.
    pub fn answered(
        &self,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let config = self.client_config();
        async move {
            for attempt in 1u64.. {
                let config = config.clone();
                let answer = tokio::task::spawn_blocking(move || -> crate::Result<()> {
                    use rdkafka::consumer::Consumer as _;
                    let client: rdkafka::consumer::BaseConsumer = config.create()?;
                    client.fetch_metadata(None, std::time::Duration::from_secs(2))?;
                    Ok(())
                })
                .await;
                match answer {
                    Ok(Ok(())) => {
                        tracing::info!(attempt, "kafka answers");
                        return true;
                    }
                    Ok(Err(e)) if attempt % 10 == 1 => {
                        tracing::warn!(attempt, error = %e, "kafka does not answer yet; waiting, not ready")
                    }
                    _ => {}
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
            unreachable!("the attempts never run out")
        }
    }

    /// What a service does before it produces or consumes: waits until a
    /// broker answers ([`KafkaArgs::answered`]), then makes sure of `topics`
    /// ([`KafkaArgs::ensure_topics`]) — before anything is published, as a
    /// broker that creates topics on first use would create them with its
    /// own settings. `Ok(false)` if `shutdown` came first.
    ///
    /// A consumer's call: `topics` are the ones it reads, and their
    /// dead-letter topics are made sure of too (it writes those). Its
    /// principal may create and describe those and no others.
    pub async fn ready_for(
        &self,
        topics: &[&str],
        shutdown: tokio_util::sync::CancellationToken,
    ) -> crate::Result<bool> {
        self.ready_with(&crate::client::with_dead_letters(topics), shutdown)
            .await
    }

    /// [`KafkaArgs::ready_for`] for a producer: makes sure of exactly
    /// `topics`, no dead-letter topics (the relay writes the saga's topics
    /// and may touch no others).
    pub async fn ready_to_publish(
        &self,
        topics: &[&str],
        shutdown: tokio_util::sync::CancellationToken,
    ) -> crate::Result<bool> {
        let names: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
        self.ready_with(&names, shutdown).await
    }

    /// Waits for a broker's answer, then makes sure of exactly `names` —
    /// again each second while the cluster cannot say (a node restarting
    /// times the admin request out): only a topic the saga cannot run on
    /// ends the wait with an error. `false` if `shutdown` came first.
    async fn ready_with(&self, names: &[String], shutdown: tokio_util::sync::CancellationToken) -> crate::Result<bool> {
        if !self.answered(shutdown.clone()).await {
            return Ok(false);
        }
        loop {
            match crate::client::ensure_exactly(self, names, &self.topic_settings()).await {
                Ok(()) => return Ok(true),
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = %e, "the brokers could not make sure of the topics yet; again in 1 s")
                }
                Err(e) => return Err(e),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }

    /// The idempotent producer for these settings (delivery timeout 15 s):
    /// `outbox::kafka::idempotent_producer` on this crate's client settings
    /// and the linger of `KAFKA_LINGER_MS`.
    pub fn producer(&self) -> crate::Result<rdkafka::producer::FutureProducer> {
        let mut config = self.client_config();
        config.set("linger.ms", self.linger_ms.to_string());
        Ok(outbox::kafka::idempotent_producer(
            config,
            std::time::Duration::from_secs(15),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    /// The settings as a service flattens them.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: super::KafkaArgs,
    }

    #[test]
    fn a_service_has_an_identity_unless_it_chose_plaintext() {
        let refused = Cli::try_parse_from(["svc"]).err().expect("refused").to_string();
        assert!(
            refused.contains("--kafka-sasl-username") && refused.contains("--kafka-sasl-password"),
            "{refused}"
        );
        let plain = Cli::try_parse_from(["svc", "--kafka-plaintext"]).unwrap();
        assert_eq!(plain.kafka.client_config().get("security.protocol"), None);

        let password = "p".repeat(32);
        let sasl = Cli::try_parse_from([
            "svc",
            "--kafka-sasl-username",
            "order-api",
            "--kafka-sasl-password",
            &password,
            "--kafka-ca-file",
            "/etc/eo/tls/ca.pem",
        ])
        .unwrap();
        let c = sasl.kafka.client_config();
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(c.get("sasl.mechanisms"), Some("SCRAM-SHA-512"));
        assert_eq!(c.get("sasl.username"), Some("order-api"));
        assert_eq!(c.get("sasl.password"), Some(password.as_str()));
        assert_eq!(c.get("ssl.ca.location"), Some("/etc/eo/tls/ca.pem"));
        assert_eq!(c.get("ssl.endpoint.identification.algorithm"), Some("https"));
        assert!(
            !format!("{:?}", sasl.kafka).contains(&password),
            "the password never prints"
        );

        let short = Cli::try_parse_from(["svc", "--kafka-sasl-username", "x", "--kafka-sasl-password", "short"])
            .err()
            .expect("refused")
            .to_string();
        assert!(short.contains("at least 32") && !short.contains("short\n"), "{short}");
    }

    #[test]
    fn the_partition_count_is_a_setting_and_the_topics_follow_it() {
        let default = Cli::try_parse_from(["svc", "--kafka-plaintext"]).unwrap();
        assert_eq!(default.kafka.topic_settings().partitions, crate::PARTITIONS);
        let twelve = Cli::try_parse_from(["svc", "--kafka-plaintext", "--kafka-partitions", "12"]).unwrap();
        assert_eq!(twelve.kafka.topic_settings().partitions, 12);
        assert!(Cli::try_parse_from(["svc", "--kafka-plaintext", "--kafka-partitions", "0"]).is_err());
    }
}
