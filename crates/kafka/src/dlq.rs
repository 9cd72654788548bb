//! Dead letters: send a message that can never be handled to its
//! dead-letter topic (the consume loop), list them, and replay them onto their original topic once
//! the cause is fixed. A replayed message keeps its key, body and identity
//! headers, so the consumer's inbox still recognises an event it already
//! applied.

use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::Result;

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

/// Every dead letter of `topic` (i.e. on `<topic>.dlq`).
pub fn list<C: crate::client::Connect + ?Sized>(kafka: &C, topic: &str) -> Result<Vec<DeadLetter>> {
    let dlq = crate::dead_letter_topic(topic);
    let group = format!("dlq-list-{}", uuid::Uuid::new_v4());
    let (messages, _) = crate::read_topic(kafka, &dlq, &group, Offset::Beginning, Duration::from_secs(2))?;
    Ok(messages.iter().map(DeadLetter::from_message).collect())
}

/// Republishes the dead letters of `topic` not replayed before onto their
/// original topic; returns how many. Progress is kept as the committed
/// offsets of the group `dlq-replay.<topic>`, so each letter is replayed once.
pub async fn replay<C: crate::client::Connect + ?Sized>(kafka: &C, topic: &str) -> Result<usize> {
    let dlq = crate::dead_letter_topic(topic);
    let (messages, consumer) = crate::read_topic(
        kafka,
        &dlq,
        &format!("dlq-replay.{topic}"),
        Offset::Stored,
        Duration::from_secs(2),
    )?;
    let producer = crate::producer(kafka)?;
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

/// Copies `msg` to its dead-letter topic with the error and origin as headers.
/// Retries until the broker accepts it; returns false only on shutdown.
pub(crate) async fn dead_letter(
    producer: &FutureProducer,
    msg: &OwnedMessage,
    consumer: &str,
    reason: &str,
    shutdown: &CancellationToken,
) -> bool {
    let topic = crate::dead_letter_topic(msg.topic());
    let partition = msg.partition().to_string();
    let offset = msg.offset().to_string();
    tracing::error!(consumer, %topic, %reason, offset = msg.offset(), "dead-lettering message");
    loop {
        let mut headers = OwnedHeaders::new();
        if let Some(original) = msg.headers() {
            for h in original.iter() {
                headers = headers.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
        let headers = headers
            .insert(Header {
                key: "dlq.error",
                value: Some(reason),
            })
            .insert(Header {
                key: "dlq.consumer",
                value: Some(consumer),
            })
            .insert(Header {
                key: "dlq.topic",
                value: Some(msg.topic()),
            })
            .insert(Header {
                key: "dlq.partition",
                value: Some(partition.as_str()),
            })
            .insert(Header {
                key: "dlq.offset",
                value: Some(offset.as_str()),
            });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(headers);
        if let Some(k) = msg.key() {
            record = record.key(k);
        }
        if let Some(p) = msg.payload() {
            record = record.payload(p);
        }
        match producer.send(record, Timeout::After(Duration::from_secs(5))).await {
            Ok(_) => {
                telemetry::metrics::incr("consumer_dead_lettered_total", &[("consumer", consumer)]);
                return true;
            }
            Err((e, _)) => {
                tracing::warn!(consumer, error = %e, "dead-letter publish failed, retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}
