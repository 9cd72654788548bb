//! Which copy of each event its consumer applied, from the broker's log and
//! the inboxes — ground truth that no service reports about itself.
//!
//! A message's copies (a republish, a reconciler's re-send, an injected
//! copy) share its event id and, keyed by the order, its partition. A
//! correct consumer applies the first copy it is delivered: it never
//! stores an offset before the copy's effect committed, so after any crash
//! it reads that copy again. An inbox row that names a later copy
//! (`inbox.source_offset`) therefore says the first copy was delivered and
//! its effect lost — and that the later copy rescued it. The rescue is
//! counted per cause: an injected copy (the header the injector sets), or
//! one the system itself published again.

use std::collections::BTreeMap;

use contract::topics::consumers;
use rdkafka::message::Headers as _;
use rdkafka::Message as _;
use sqlx::Connection as _;
use uuid::Uuid;

use super::inject::INJECTED;
use crate::stack::Stack;

/// One copy of an event in the log: partition, offset, injected by the suite.
#[derive(Debug, Clone, Copy)]
pub(super) struct Copy {
    order_id: Uuid,
    partition: i32,
    offset: i64,
    injected: bool,
}

/// Every copy of every event, per topic, as read back from the log.
#[derive(Debug, Default)]
pub(super) struct Log {
    copies: BTreeMap<(String, Uuid), Vec<Copy>>,
}

impl Log {
    /// Adds the messages of `topic` read back from the log.
    pub fn add(&mut self, topic: &str, messages: &[rdkafka::message::OwnedMessage]) {
        for m in messages {
            let Ok(env) = contract::Envelope::from_bytes(m.payload().unwrap_or_default()) else {
                continue;
            };
            let injected = m.headers().is_some_and(|h| h.iter().any(|h| h.key == INJECTED));
            self.copies
                .entry((topic.to_owned(), env.event_id))
                .or_default()
                .push(Copy {
                    order_id: env.order_id,
                    partition: m.partition(),
                    offset: m.offset(),
                    injected,
                });
        }
    }

    /// Copies beyond the first, per topic.
    pub fn duplicates_per_topic(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for ((topic, _), copies) in &self.copies {
            *out.entry(topic.clone()).or_default() += copies.len() - 1;
        }
        out
    }
}

/// An event applied from a later copy than the first it was delivered as.
#[derive(Debug, Clone)]
pub(super) struct LateCopy {
    /// The consumer that applied it.
    pub consumer: &'static str,
    /// The event.
    pub event_id: Uuid,
    /// Its order.
    pub order_id: Uuid,
    /// Injected by the suite (else published again by the system).
    pub injected: bool,
    /// The offsets of the first copy and of the one applied.
    pub first: i64,
    /// See `first`.
    pub applied: i64,
    /// When the inbox recorded the copy applied.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// Every event some consumer applied from a copy later than the first in
/// its partition, read from the inboxes against `log`.
pub(super) async fn late_copies(stack: &Stack, log: &Log) -> anyhow::Result<Vec<LateCopy>> {
    let mut out = Vec::new();
    for (db, consumer) in [
        ("orders", consumers::ORDER_SAGA),
        ("inventory", consumers::INVENTORY),
        ("payments", consumers::PAYMENT),
    ] {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await?;
        let rows: Vec<(Uuid, i32, i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
            "SELECT event_id, source_partition, source_offset, processed_at FROM inbox
             WHERE consumer = $1 AND source_offset IS NOT NULL",
        )
        .bind(consumer.name)
        .fetch_all(&mut c)
        .await?;
        for (event_id, partition, offset, at) in rows {
            let Some(copies) = log.copies.get(&(consumer.topic.to_owned(), event_id)) else {
                anyhow::bail!(
                    "{}'s inbox names event {event_id} at {partition}:{offset}, which the log of {} does not hold",
                    consumer.name,
                    consumer.topic
                );
            };
            let here = copies.iter().filter(|c| c.partition == partition);
            let first = here.clone().map(|c| c.offset).min();
            let applied = here.clone().find(|c| c.offset == offset);
            match (first, applied) {
                (Some(first), Some(applied)) if first < offset => out.push(LateCopy {
                    consumer: consumer.name,
                    event_id,
                    order_id: applied.order_id,
                    injected: applied.injected,
                    first,
                    applied: offset,
                    at,
                }),
                (Some(_), Some(_)) => {}
                _ => anyhow::bail!(
                    "{}'s inbox names event {event_id} at {partition}:{offset}, not a copy in the log",
                    consumer.name
                ),
            }
        }
    }
    Ok(out)
}
