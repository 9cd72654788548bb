//! Dead letters: list them, and replay them onto their original topic once
//! the cause is fixed. A replayed message keeps its key, body and identity
//! headers, so the consumer's inbox still recognises an event it already
//! applied.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use rdkafka::{Message as _, Offset, TopicPartitionList};

use crate::{kafka, Result};

/// One dead letter.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Partition in the dead-letter topic.
    pub partition: i32,
    /// Offset in the dead-letter topic.
    pub offset: i64,
    /// Message key (the order id).
    pub key: Option<String>,
    /// Why it was dead-lettered.
    pub error: Option<String>,
    /// Consumer that gave up on it.
    pub consumer: Option<String>,
    /// Where it came from.
    pub original_topic: Option<String>,
    /// The body, as received.
    pub payload: Vec<u8>,
    /// All headers.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl DeadLetter {
    fn from_message(m: &OwnedMessage) -> Self {
        let headers: Vec<(String, Option<Vec<u8>>)> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let get = |k: &str| {
            headers
                .iter()
                .find(|(key, _)| key == k)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        Self {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            error: get("dlq.error"),
            consumer: get("dlq.consumer"),
            original_topic: get("dlq.topic"),
            payload: m.payload().unwrap_or_default().to_vec(),
            headers,
        }
    }
}

/// Reads `topic` from `start` (per partition) with `group` up to the end of
/// the log as it was when reading began (the partitions' high watermarks),
/// or until no message arrived for `idle` after the first one.
/// Returns the messages and the consumer (to commit).
pub fn read(
    brokers: &str,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
) -> Result<(Vec<OwnedMessage>, BaseConsumer)> {
    read_at_most(brokers, topic, group, start, idle, usize::MAX)
}

/// Like [`read`], stopping after `max` messages.
pub fn read_at_most(
    brokers: &str,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
    max: usize,
) -> Result<(Vec<OwnedMessage>, BaseConsumer)> {
    let consumer: BaseConsumer = kafka::client_config(brokers)
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

/// Every dead letter of `topic` (i.e. on `<topic>.dlq`).
pub fn list(brokers: &str, topic: &str) -> Result<Vec<DeadLetter>> {
    let dlq = crate::message::dead_letter_topic(topic);
    let group = format!("dlq-list-{}", uuid::Uuid::new_v4());
    let (messages, _) = read(brokers, &dlq, &group, Offset::Beginning, Duration::from_secs(2))?;
    Ok(messages.iter().map(DeadLetter::from_message).collect())
}

/// Republishes the dead letters of `topic` not replayed before onto their
/// original topic; returns how many. Progress is kept as the committed
/// offsets of the group `dlq-replay.<topic>`, so each letter is replayed once.
pub async fn replay(brokers: &str, topic: &str) -> Result<usize> {
    let dlq = crate::message::dead_letter_topic(topic);
    let (messages, consumer) = read(
        brokers,
        &dlq,
        &format!("dlq-replay.{topic}"),
        Offset::Stored,
        Duration::from_secs(2),
    )?;
    let producer = kafka::producer(brokers)?;
    for m in &messages {
        let letter = DeadLetter::from_message(m);
        let target = letter.original_topic.clone().unwrap_or_else(|| topic.to_owned());
        let mut headers = OwnedHeaders::new();
        for (k, v) in letter.headers.iter().filter(|(k, _)| !k.starts_with("dlq.")) {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&target)
            .payload(letter.payload.as_slice())
            .headers(headers);
        if let Some(k) = m.key() {
            record = record.key(k);
        }
        producer
            .send(record, Timeout::After(Duration::from_secs(5)))
            .await
            .map_err(|(e, _)| e)?;
        let mut done = TopicPartitionList::new();
        done.add_partition_offset(&dlq, m.partition(), Offset::Offset(m.offset() + 1))?;
        consumer.commit(&done, CommitMode::Sync)?;
    }
    Ok(messages.len())
}
