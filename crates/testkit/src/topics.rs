//! Topics for tests that must not lean on the crate under test: created
//! with the admin API, and read back whole from the beginning.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

/// Creates each of `topics` with `partitions` partitions and one replica.
pub async fn create(brokers: &str, topics: &[&str], partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("log_level", "3")
        .create()?;
    let new: Vec<_> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new, &opts).await? {
        result.map_err(|(topic, code)| anyhow::anyhow!("creating {topic}: {code}"))?;
    }
    Ok(())
}

/// Every message of `topic`, each partition read from its start to the
/// high watermark it had when reading began (per partition in offset
/// order); fails if that end is not reached within 30 s.
pub async fn read_all(brokers: &str, topic: &str) -> anyhow::Result<Vec<OwnedMessage>> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_blocking(&brokers, &topic)).await?
}

fn read_blocking(brokers: &str, topic: &str) -> anyhow::Result<Vec<OwnedMessage>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("testkit-read-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    anyhow::ensure!(!partitions.is_empty(), "{topic} has no partitions");
    let mut ends = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        if high > low {
            ends.insert(p, high);
            assignment.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    while !ends.is_empty() {
        anyhow::ensure!(
            Instant::now() < end,
            "{topic}: partitions {ends:?} not read to their end"
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message?;
        if ends
            .get(&message.partition())
            .is_some_and(|high| message.offset() + 1 >= *high)
        {
            ends.remove(&message.partition());
        }
        out.push(message.detach());
    }
    Ok(out)
}
