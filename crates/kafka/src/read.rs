//! Reading a topic back to its end, outside any consumer group's progress:
//! dead letters, the chaos audit and tests use it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message as _, Offset, TopicPartitionList};

use crate::client::Connect;
use crate::Result;

/// Reads `topic` from `start` (per partition) with `group` up to the end of
/// the log as it was when reading began (the partitions' high watermarks),
/// or until no message arrived for `idle` after the first one.
/// Returns the messages and the consumer (to commit).
pub fn read_topic<C: Connect + ?Sized>(
    kafka: &C,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
) -> Result<(Vec<OwnedMessage>, BaseConsumer)> {
    read_topic_at_most(kafka, topic, group, start, idle, usize::MAX)
}

/// Like [`read_topic`], stopping after `max` messages.
pub fn read_topic_at_most<C: Connect + ?Sized>(
    kafka: &C,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
    max: usize,
) -> Result<(Vec<OwnedMessage>, BaseConsumer)> {
    read(kafka, topic, group, start, idle, max).map(|(out, consumer, _)| (out, consumer))
}

/// Reads the whole of `topic` as [`read_topic`] does from the beginning, and
/// fails with [`crate::Error::PartialRead`] unless every partition was read
/// to the high watermark it had when reading began: an audit that counts
/// copies must never count from part of the log.
pub fn read_whole_topic<C: Connect + ?Sized>(
    kafka: &C,
    topic: &str,
    group: &str,
    idle: Duration,
) -> Result<Vec<OwnedMessage>> {
    let (out, _, remaining) = read(kafka, topic, group, Offset::Beginning, idle, usize::MAX)?;
    if remaining.is_empty() {
        Ok(out)
    } else {
        Err(crate::Error::PartialRead {
            topic: topic.to_owned(),
            partitions: remaining.into_keys().collect(),
        })
    }
}

/// The reader behind both: the messages, the consumer, and the partitions
/// (with their last offset) not read to their end.
fn read<C: Connect + ?Sized>(
    kafka: &C,
    topic: &str,
    group: &str,
    start: Offset,
    idle: Duration,
    max: usize,
) -> Result<(Vec<OwnedMessage>, BaseConsumer, BTreeMap<i32, i64>)> {
    let consumer: BaseConsumer = kafka
        .client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    // A broker busy with a long log answers slowly: generous timeouts.
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
    let mut tpl = TopicPartitionList::new();
    // Partition → offset of its last message when reading began.
    let mut remaining: BTreeMap<i32, i64> = BTreeMap::new();
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
    Ok((out, consumer, remaining))
}

/// How far consumer group `group` is behind on `topic`: the sum over its
/// partitions of the high watermark minus the group's committed offset
/// (the whole partition where it committed nothing). Reads the group's
/// offsets without joining it. Blocking.
pub fn group_lag<C: Connect + ?Sized>(kafka: &C, group: &str, topic: &str, timeout: Duration) -> Result<i64> {
    let consumer: BaseConsumer = kafka
        .client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut tpl = TopicPartitionList::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            tpl.add_partition(topic, p.id());
        }
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    let mut lag = 0;
    for p in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(topic, p.partition(), timeout)?;
        let done = match p.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        lag += (high - done).max(0);
    }
    Ok(lag)
}
