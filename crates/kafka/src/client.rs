//! Kafka client wiring: the client settings every process shares, topic
//! creation, and the saga's producers — built on the relay's
//! `outbox::kafka` (the idempotent producer, `acks=all`, the identity
//! headers every published message carries), so there is one producer
//! configuration for the outbox and for dead letters.

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::FutureProducer;
use rdkafka::util::Timeout;

use crate::{Error, Result};

/// Partitions per topic unless `KAFKA_PARTITIONS` says otherwise
/// ([`crate::KafkaArgs::partitions`]). The message key (order id) keeps one
/// order's messages in one partition, hence in order.
pub const PARTITIONS: i32 = 3;

/// How long librdkafka waits for the answer to a request before it drops
/// the connection and sends the request again (`socket.timeout.ms`; a
/// fetch waits this beyond `fetch.wait.max.ms`). librdkafka's default, 60 s,
/// equals the saga's deadlines (60 s): a request left unanswered by a
/// broker that was SIGKILLed and restarted holds its partitions that long,
/// and the deadline reconciler acts first. The 100/s chaos run on CI
/// (commit 299f6f4) stalled ~50 s after its broker restart, ending near that
/// timeout, and failed on orders the reconciler had touched. A join is not
/// bound by it (librdkafka gives a JoinGroup `max.poll.interval.ms` + 3 s).
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

/// Base client config for `brokers` (a comma-separated `host:port` list).
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("socket.keepalive.enable", "true")
        .set("socket.timeout.ms", SOCKET_TIMEOUT.as_millis().to_string())
        .set("reconnect.backoff.max.ms", "1000")
        .set("log_level", "4");
    c
}

/// Where and how to reach the brokers: a bare `host:port` list (a local
/// plaintext broker: library tests, examples) or a service's
/// [`crate::KafkaArgs`] (its principal, its CA). Every function here that
/// makes a client takes one.
pub trait Connect {
    /// The base client configuration (bootstrap servers, timeouts, security).
    fn client_config(&self) -> ClientConfig;
}

impl Connect for str {
    fn client_config(&self) -> ClientConfig {
        client_config(self)
    }
}

impl Connect for String {
    fn client_config(&self) -> ClientConfig {
        client_config(self)
    }
}

impl Connect for crate::KafkaArgs {
    fn client_config(&self) -> ClientConfig {
        crate::KafkaArgs::client_config(self)
    }
}

/// The dead-letter topic of `topic`.
pub fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}.dlq")
}

/// The idempotent producer (`outbox::kafka::idempotent_producer`) on this
/// crate's client settings, with a delivery timeout of 15 s.
pub fn producer<C: Connect + ?Sized>(kafka: &C) -> Result<FutureProducer> {
    producer_with_timeout(kafka, Duration::from_secs(15))
}

/// The idempotent producer with a delivery timeout of `timeout`.
pub fn producer_with_timeout<C: Connect + ?Sized>(kafka: &C, timeout: Duration) -> Result<FutureProducer> {
    Ok(outbox::kafka::idempotent_producer(kafka.client_config(), timeout)?)
}

/// The timestamp type of every topic this crate creates: the broker's
/// append time.
pub const LOG_APPEND_TIME: &str = "LogAppendTime";

/// What every topic of the saga must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSettings {
    /// Partitions ([`PARTITIONS`]).
    pub partitions: i32,
    /// Replicas; above one, `min.insync.replicas` is one less.
    pub replication_factor: i32,
    /// `retention.ms`, when set: how long the broker may redeliver a
    /// message, which every inbox's retention must outlast.
    pub retention: Option<Duration>,
}

impl TopicSettings {
    /// `min.insync.replicas` of these topics: one less than the replicas
    /// (2 of 3), so a write survives a node's loss and one node may be down;
    /// 1 for a single replica.
    pub fn min_insync_replicas(&self) -> i32 {
        (self.replication_factor - 1).max(1)
    }
}

impl Default for TopicSettings {
    fn default() -> Self {
        Self {
            partitions: PARTITIONS,
            replication_factor: 1,
            retention: None,
        }
    }
}

/// Creates `topics` (and their dead-letter topics) if they do not exist,
/// with [`PARTITIONS`] partitions, one replica and the broker's retention.
pub async fn ensure_topics<C: Connect + ?Sized>(kafka: &C, topics: &[&str]) -> Result<()> {
    ensure_topics_with(kafka, topics, &TopicSettings::default()).await
}

/// Creates `topics` (and their dead-letter topics) that are missing with
/// `settings`, and checks the ones that exist:
/// - a different partition count is refused: adding partitions moves keys
///   (an order's next message would land in another partition, behind or
///   ahead of its earlier ones), so only an operator may decide that;
/// - a different `retention.ms` is altered to `settings.retention` (the
///   other topic settings set on it are kept): a longer or infinite one
///   breaks the retention chain (the broker could redeliver a message the
///   inbox has forgotten), a shorter one loses messages a stopped consumer
///   has not read.
pub async fn ensure_topics_with<C: Connect + ?Sized>(
    kafka: &C,
    topics: &[&str],
    settings: &TopicSettings,
) -> Result<()> {
    ensure_exactly(kafka, &with_dead_letters(topics), settings).await
}

/// `topics` and, after them, their dead-letter topics.
pub fn with_dead_letters(topics: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
    names.extend(topics.iter().map(|t| dead_letter_topic(t)));
    names
}

/// [`ensure_topics_with`] for exactly `names`, no dead-letter topics added
/// (a producer's topics: it may create and describe those, not others).
pub async fn ensure_exactly<C: Connect + ?Sized>(kafka: &C, names: &[String], settings: &TopicSettings) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    let retention_ms = settings.retention.map(|r| r.as_millis().to_string());
    let min_isr = settings.min_insync_replicas().to_string();
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            // The broker stamps each record with the time it appended it,
            // whatever the producer says: the audit holds the outbox's marks
            // against the log on the broker's word, not the relay's.
            let mut topic = NewTopic::new(
                n,
                settings.partitions,
                TopicReplication::Fixed(settings.replication_factor),
            )
            .set("message.timestamp.type", LOG_APPEND_TIME);
            if settings.replication_factor > 1 {
                topic = topic.set("min.insync.replicas", &min_isr);
            }
            match &retention_ms {
                Some(ms) => topic.set("retention.ms", ms),
                None => topic,
            }
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Timeout::After(Duration::from_secs(10))));
    let mut existing = Vec::new();
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(_) => {}
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => existing.push(topic),
            Err((topic, code)) => {
                tracing::error!(%topic, ?code, "topic creation failed");
                return Err(Error::Kafka(rdkafka::error::KafkaError::AdminOp(code)));
            }
        }
    }
    if existing.is_empty() {
        return Ok(());
    }
    check_partitions(kafka.client_config(), &existing, settings.partitions).await?;
    if let Some(ms) = &retention_ms {
        for topic in &existing {
            align_retention(&admin, topic, ms, &opts).await?;
        }
    }
    Ok(())
}

async fn check_partitions(config: ClientConfig, topics: &[String], wanted: i32) -> Result<()> {
    let topics = topics.to_vec();
    let counts = tokio::task::spawn_blocking(move || -> Result<Vec<(String, usize)>> {
        let client: BaseConsumer = config.create()?;
        let metadata = client.fetch_metadata(None, Duration::from_secs(10))?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| topics.iter().any(|n| n == t.name()))
            .map(|t| (t.name().to_owned(), t.partitions().len()))
            .collect())
    })
    .await
    .map_err(|e| Error::Topic(e.to_string()))??;
    for (topic, count) in counts {
        if count != wanted as usize {
            return Err(Error::Topic(format!(
                "topic {topic} has {count} partitions where the saga needs {wanted}: changing the count moves \
                 order ids to other partitions and breaks each order's message order; drain and recreate the \
                 topic, or run with the count it has"
            )));
        }
    }
    Ok(())
}

async fn align_retention(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    wanted_ms: &str,
    opts: &AdminOptions,
) -> Result<()> {
    let config = describe_topic(admin, topic, opts).await?;
    let current = config.get("retention.ms").and_then(|e| e.0.clone());
    if current.as_deref() == Some(wanted_ms) {
        return Ok(());
    }
    // AlterConfigs replaces the topic's whole set of its own settings: send
    // the ones it has (DynamicTopic) with retention.ms changed.
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (name, (value, source)) in &config {
        if *source == ConfigSource::DynamicTopic && name != "retention.ms" {
            if let Some(v) = value {
                alter = alter.set(name, v);
            }
        }
    }
    alter = alter.set("retention.ms", wanted_ms);
    for result in admin.alter_configs([&alter], opts).await? {
        result.map_err(|(_, code)| {
            Error::Topic(format!(
                "topic {topic} has retention.ms={} where the retention chain needs {wanted_ms}, and altering it \
                 failed ({code:?})",
                current.as_deref().unwrap_or("?")
            ))
        })?;
    }
    tracing::warn!(
        %topic,
        from = current.as_deref().unwrap_or("?"),
        to = wanted_ms,
        "topic retention.ms differed from KAFKA_TOPIC_RETENTION_SECS: altered (the inbox retention chain depends on it)"
    );
    Ok(())
}

type TopicConfig = std::collections::BTreeMap<String, (Option<String>, ConfigSource)>;

async fn describe_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    opts: &AdminOptions,
) -> Result<TopicConfig> {
    let described = admin.describe_configs([&ResourceSpecifier::Topic(topic)], opts).await?;
    let resource = described
        .into_iter()
        .next()
        .ok_or_else(|| Error::Topic(format!("no configuration returned for topic {topic}")))?
        .map_err(|code| Error::Topic(format!("describing topic {topic} failed: {code:?}")))?;
    Ok(resource
        .entries
        .into_iter()
        .map(|e| (e.name, (e.value, e.source)))
        .collect())
}

/// A topic's settings as the broker reports them (DescribeConfigs): name → value.
pub async fn topic_config<C: Connect + ?Sized>(
    kafka: &C,
    topic: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    let opts = AdminOptions::new().request_timeout(Some(Timeout::After(Duration::from_secs(10))));
    Ok(describe_topic(&admin, topic, &opts)
        .await?
        .into_iter()
        .filter_map(|(name, (value, _))| Some((name, value?)))
        .collect())
}

/// Publishes one serialised message and waits for the broker's delivery
/// report (the relay's [`outbox::kafka::publish`], with this crate's error).
pub async fn publish(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    body: &[u8],
    headers: OwnedHeaders,
) -> Result<()> {
    Ok(outbox::kafka::publish(producer, topic, key, body, headers).await?)
}

#[cfg(test)]
mod tests {
    use super::TopicSettings;

    #[test]
    fn min_insync_replicas_is_one_less_than_the_replicas_and_at_least_one() {
        let isr = |replication_factor| {
            TopicSettings {
                replication_factor,
                ..Default::default()
            }
            .min_insync_replicas()
        };
        assert_eq!([isr(1), isr(2), isr(3), isr(5)], [1, 1, 2, 4]);
    }
}
