//! Kafka client wiring: one place that knows the client settings the
//! guarantees depend on (idempotent producer, manual offset commits), and
//! reading a topic back to its end (dead letters, the chaos audit, tests).

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Message as _, Offset, TopicPartitionList};

use crate::{Envelope, Result};

/// Partitions per topic. The message key (order id) keeps one order's
/// messages in one partition, hence in order.
pub const PARTITIONS: i32 = 3;

/// Base client config for `brokers` (a comma-separated `host:port` list).
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("socket.keepalive.enable", "true")
        .set("reconnect.backoff.max.ms", "1000")
        .set("log_level", "4");
    // librdkafka's own debug contexts (e.g. `cgrp,fetch`), for diagnosing a broker.
    if let Ok(debug) = std::env::var("KAFKA_DEBUG") {
        c.set("debug", debug).set("log_level", "7");
    }
    c
}

/// The idempotent producer: `enable.idempotence=true` implies `acks=all` and
/// lets the broker drop the duplicates *it* would create on internal retries.
/// It cannot drop a republish of the same outbox row after a relay crash —
/// that is the inbox's job.
pub fn producer(brokers: &str) -> Result<FutureProducer> {
    producer_with_timeout(brokers, Duration::from_secs(15))
}

/// The idempotent producer with a delivery timeout of `timeout`.
pub fn producer_with_timeout(brokers: &str, timeout: Duration) -> Result<FutureProducer> {
    Ok(client_config(brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // No lingering: a lone outbox row goes out at once (idle-to-published
        // p50 ~4.5 ms instead of ~9 ms); batches still form while requests are in flight.
        .set("linger.ms", "0")
        .set("message.timeout.ms", timeout.as_millis().to_string())
        .create()?)
}

/// Creates `topics` (and their dead-letter topics) if they do not exist.
pub async fn ensure_topics(brokers: &str, topics: &[&str]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(brokers).create()?;
    let mut names: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
    names.extend(topics.iter().map(|t| crate::message::dead_letter_topic(t)));
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Timeout::After(Duration::from_secs(10))));
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(crate::Error::Kafka(rdkafka::error::KafkaError::AdminOp(code)))
                    .inspect_err(|_| tracing::error!(%topic, ?code, "topic creation failed"));
            }
        }
    }
    Ok(())
}

/// Kafka headers of an envelope: identity and trace context, so tools and
/// dead-letter readers see them without parsing the body.
pub fn headers(envelope: &Envelope) -> OwnedHeaders {
    headers_for(
        &envelope.event_id.to_string(),
        &envelope.event_type,
        envelope.traceparent.as_deref(),
    )
}

/// The same headers from their parts (the relay reads them from its row).
pub fn headers_for(event_id: &str, event_type: &str, traceparent: Option<&str>) -> OwnedHeaders {
    let mut h = OwnedHeaders::new()
        .insert(Header {
            key: "event_id",
            value: Some(event_id),
        })
        .insert(Header {
            key: "event_type",
            value: Some(event_type),
        });
    if let Some(tp) = traceparent {
        h = h.insert(Header {
            key: "traceparent",
            value: Some(tp),
        });
    }
    h
}

/// Publishes one envelope to `topic` keyed by its order id and waits for the
/// broker's delivery report.
pub async fn publish(producer: &FutureProducer, topic: &str, envelope: &Envelope) -> Result<()> {
    let key = envelope.order_id.to_string();
    publish_raw(producer, topic, &key, &envelope.to_bytes(), headers(envelope)).await
}

/// Publishes an already serialised envelope and waits for the delivery report.
pub async fn publish_raw(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    body: &[u8],
    headers: OwnedHeaders,
) -> Result<()> {
    let record = FutureRecord::to(topic).key(key).payload(body).headers(headers);
    producer
        .send(record, Timeout::After(Duration::from_secs(5)))
        .await
        .map(|_| ())
        .map_err(|(e, _)| e.into())
}

/// Reads `topic` from `start` (per partition) with `group` up to the end of
/// the log as it was when reading began (the partitions' high watermarks),
/// or until no message arrived for `idle` after the first one.
/// Returns the messages and the consumer (to commit).
pub fn read_topic(
    brokers: &str,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
) -> Result<(Vec<OwnedMessage>, BaseConsumer)> {
    read_topic_at_most(brokers, topic, group, start, idle, usize::MAX)
}

/// Like [`read_topic`], stopping after `max` messages.
pub fn read_topic_at_most(
    brokers: &str,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
    max: usize,
) -> Result<(Vec<OwnedMessage>, BaseConsumer)> {
    let consumer: BaseConsumer = client_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    // A broker busy with a long log answers slowly: generous timeouts.
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
    let mut tpl = TopicPartitionList::new();
    // Partition → offset of its last message when reading began.
    let mut remaining: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
    for t in md.topics() {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), start)?;
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(30))?;
            if high > low {
                remaining.insert(p.id(), high - 1);
            }
        }
    }
    if start == Offset::Stored {
        // Partitions whose committed offset is already at the end have nothing to read.
        let committed = consumer.committed_offsets(tpl.clone(), Duration::from_secs(30))?;
        for e in committed.elements() {
            if let Offset::Offset(next) = e.offset() {
                if remaining.get(&e.partition()).is_some_and(|end| next > *end) {
                    remaining.remove(&e.partition());
                }
            }
        }
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let mut last = Instant::now();
    // The first fetch of a long log can take a while: the idle clock starts
    // with the first message (or gives up after a generous wait for it).
    let first_wait = idle.max(Duration::from_secs(20));
    while !remaining.is_empty() && out.len() < max {
        let limit = if out.is_empty() { first_wait } else { idle };
        if last.elapsed() > limit {
            break;
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if remaining.get(&m.partition()).is_some_and(|end| m.offset() >= *end) {
                remaining.remove(&m.partition());
            }
            out.push(m.detach());
            last = Instant::now();
        }
    }
    Ok((out, consumer))
}
