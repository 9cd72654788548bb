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

/// One copy of an event in the log: partition, offset, the broker's time
/// of it (ms; the append time on the saga's topics), injected by the suite.
#[derive(Debug, Clone, Copy)]
pub(super) struct Copy {
    order_id: Uuid,
    partition: i32,
    offset: i64,
    at_ms: Option<i64>,
    injected: bool,
}

/// Every copy of every event, per topic, as read back from the log — and
/// what each event caused: the distinct events of each type published with
/// it as their cause, with the broker's time of each.
#[derive(Debug, Default)]
pub(super) struct Log {
    copies: BTreeMap<(String, Uuid), Vec<Copy>>,
    caused: BTreeMap<(Uuid, String), Answers>,
    /// Every event in the log once: its topic, type and order.
    events: BTreeMap<Uuid, Event>,
    /// Messages whose `event_id` / `event_type` headers or key disagree
    /// with their body (what a tool or a dead-letter reader trusts without
    /// parsing), described; and how many there were.
    pub mislabelled: (usize, Vec<String>),
}

/// An event as the log holds it: topic, type, order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Event {
    /// Its topic.
    pub topic: String,
    /// Its type.
    pub event_type: String,
    /// Its order.
    pub order_id: Uuid,
}

/// The distinct events of one type one event caused: each one's order and
/// the broker's time of its first copy (ms).
type Answers = BTreeMap<Uuid, (Uuid, Option<i64>)>;

/// What in `m`'s headers or key disagrees with its body, if anything: the
/// `event_id` and `event_type` headers must equal the envelope's, the key
/// its order id.
fn mislabelled(m: &rdkafka::message::OwnedMessage, env: &contract::Envelope) -> Option<String> {
    let header = |name: &str| {
        m.headers()
            .and_then(|h| h.iter().find(|h| h.key == name))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
    let (id, kind, order) = (
        env.event_id.to_string(),
        env.event_type.clone(),
        env.order_id.to_string(),
    );
    [
        ("event_id header", header("event_id"), id),
        ("event_type header", header("event_type"), kind),
        ("key", key, order),
    ]
    .into_iter()
    .find(|(_, got, want)| got.as_deref() != Some(want.as_str()))
    .map(|(what, got, want)| format!("{what} {got:?}, body says {want}"))
}

/// An event that caused two distinct events of one type: it was applied
/// twice (each application published its own answer under a new id).
#[derive(Debug, Clone)]
pub(super) struct AnsweredTwice {
    /// The event applied twice.
    pub cause: Uuid,
    /// Its order.
    pub order_id: Uuid,
    /// The type of the answers.
    pub event_type: String,
    /// How many distinct answers of that type.
    pub answers: usize,
    /// When the broker appended the second answer.
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Log {
    /// Adds the messages of `topic` read back from the log.
    pub fn add(&mut self, topic: &str, messages: &[rdkafka::message::OwnedMessage]) {
        for m in messages {
            let Ok(env) = contract::Envelope::from_bytes(m.payload().unwrap_or_default()) else {
                continue;
            };
            let injected = m.headers().is_some_and(|h| h.iter().any(|h| h.key == INJECTED));
            if let Some(wrong) = mislabelled(m, &env) {
                self.mislabelled.0 += 1;
                if self.mislabelled.1.len() < 5 {
                    self.mislabelled
                        .1
                        .push(format!("{topic} {}:{}: {wrong}", m.partition(), m.offset()));
                }
            }
            if let Some(cause) = env.causation_id {
                self.caused
                    .entry((cause, env.event_type.clone()))
                    .or_default()
                    .entry(env.event_id)
                    .or_insert((env.order_id, m.timestamp().to_millis()));
            }
            self.events.entry(env.event_id).or_insert_with(|| Event {
                topic: topic.to_owned(),
                event_type: env.event_type.clone(),
                order_id: env.order_id,
            });
            self.copies
                .entry((topic.to_owned(), env.event_id))
                .or_default()
                .push(Copy {
                    order_id: env.order_id,
                    partition: m.partition(),
                    offset: m.offset(),
                    at_ms: m.timestamp().to_millis(),
                    injected,
                });
        }
    }

    /// Every event the log shows applied twice: one event, copies or not,
    /// must cause at most one event of each type (a deadline's re-send goes
    /// out under the id it was first sent with, so it is not a second one).
    /// Ground truth of "k copies, one effect" from the log alone.
    pub fn answered_twice(&self) -> Vec<AnsweredTwice> {
        self.caused
            .iter()
            .filter(|(_, answers)| answers.len() > 1)
            .map(|((cause, event_type), answers)| {
                let mut times: Vec<i64> = answers.values().filter_map(|(_, t)| *t).collect();
                times.sort_unstable();
                AnsweredTwice {
                    cause: *cause,
                    order_id: answers.values().next().map(|(o, _)| *o).unwrap_or_default(),
                    event_type: event_type.clone(),
                    answers: answers.len(),
                    at: times.get(1).and_then(|ms| chrono::DateTime::from_timestamp_millis(*ms)),
                }
            })
            .collect()
    }

    /// When the broker appended the first copy of `event_id` on `topic`
    /// (ms), if the log holds one.
    pub fn first_appended(&self, topic: &str, event_id: Uuid) -> Option<i64> {
        self.copies
            .get(&(topic.to_owned(), event_id))?
            .iter()
            .filter_map(|c| c.at_ms)
            .min()
    }

    /// When the broker appended the first copy of `event_id` on any topic (ms).
    pub fn first_appended_anywhere(&self, event_id: Uuid) -> Option<i64> {
        contract::topics::ALL
            .iter()
            .filter_map(|topic| self.first_appended(topic, event_id))
            .min()
    }

    /// Every event in the log, once each.
    pub fn events(&self) -> &BTreeMap<Uuid, Event> {
        &self.events
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

#[cfg(test)]
mod tests {
    use contract::{Envelope, Message};
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;

    use super::Log;

    fn at(envelope: &Envelope, offset: i64) -> OwnedMessage {
        labelled(envelope, offset, &envelope.event_type, true)
    }

    /// `envelope` at `offset` with `event_type` in its header, keyed by its
    /// order or not.
    fn labelled(envelope: &Envelope, offset: i64, event_type: &str, keyed: bool) -> OwnedMessage {
        let body = envelope.to_bytes();
        let time = Timestamp::CreateTime(1_000 + offset);
        let headers = kafka::headers(&envelope.event_id.to_string(), event_type, None);
        let key = keyed.then(|| envelope.order_id.to_string().into_bytes());
        OwnedMessage::new(Some(body), key, "order.events".into(), time, 0, offset, Some(headers))
    }

    #[test]
    fn headers_and_key_that_disagree_with_the_body_are_named() {
        let order = uuid::Uuid::new_v4();
        let right = Envelope::new(order, &Message::StockReleased, None);
        let mut log = Log::default();
        log.add("order.events", &[at(&right, 1)]);
        assert_eq!(log.mislabelled.0, 0);
        let wrong_type = labelled(&right, 2, "StockReserved", true);
        let no_key = labelled(&right, 3, &right.event_type, false);
        log.add("order.events", &[wrong_type, no_key]);
        assert_eq!(log.mislabelled.0, 2, "{:?}", log.mislabelled.1);
        assert!(
            log.mislabelled.1[0].contains("event_type header"),
            "{:?}",
            log.mislabelled.1
        );
        assert!(log.mislabelled.1[1].contains("key None"), "{:?}", log.mislabelled.1);
    }

    #[test]
    fn one_cause_answered_twice_under_new_ids_is_seen_and_a_resend_is_not() {
        let order = uuid::Uuid::new_v4();
        let command = Envelope::new(order, &Message::ReleaseStock, None);
        let reply = Envelope::new(order, &Message::StockReleased, Some(&command));
        let other_type = Envelope::new(order, &Message::StockReserved, Some(&command));
        let mut log = Log::default();
        // The reply, a copy of it (re-sent under its id), another type.
        log.add("order.events", &[at(&reply, 1), at(&reply, 2), at(&other_type, 3)]);
        assert!(log.answered_twice().is_empty());
        // A second application publishes a second reply of the same type.
        let again = Envelope::new(order, &Message::StockReleased, Some(&command));
        log.add("order.events", &[at(&again, 4)]);
        let twice = log.answered_twice();
        assert_eq!(twice.len(), 1);
        let t = &twice[0];
        assert_eq!((t.cause, t.order_id, t.answers), (command.event_id, order, 2));
        assert_eq!(
            t.at.map(|at| at.timestamp_millis()),
            Some(1_004),
            "the second answer's time"
        );
    }
}
