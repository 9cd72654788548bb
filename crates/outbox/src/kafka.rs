//! The relay's Kafka side (feature `kafka`): how an outbox row becomes a
//! Kafka record, and the [`KafkaPublisher`] that sends a claimed batch
//! through rdkafka's idempotent producer.
//!
//! Each row is published under its message key (the order id, so one
//! order's rows share a partition and keep their order), with its body as
//! written and its identity in headers (`event_id`, `event_type`,
//! `traceparent`): a consumer can route and deduplicate without parsing
//! the body, and a republish carries the same bytes and the same id. A
//! relay of several services' outboxes stamps each record with the
//! [`PRODUCER`] it read the row from ([`KafkaPublisher::stamp_producer`]).

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tracing::Instrument as _;

use crate::relay::{PendingRow, PublishError, Publisher};

/// Links the publish span of a row to the trace that wrote it and returns
/// the `traceparent` the record carries. [`KafkaPublisher`] passes the row's
/// own through by default; a service with OpenTelemetry sets one with
/// [`KafkaPublisher::trace_with`] that makes the span a child of the row's
/// context and sends the span's.
pub type TraceLink = fn(&tracing::Span, Option<&str>) -> Option<String>;

fn pass_through(_: &tracing::Span, traceparent: Option<&str>) -> Option<String> {
    traceparent.map(str::to_owned)
}

/// The header carrying a record's event id (the body's, on every copy).
pub const EVENT_ID: &str = "event_id";

/// The header carrying a record's message type (the row's `event_type`).
pub const EVENT_TYPE: &str = "event_type";

/// The header naming the service whose outbox a record came from, as the
/// relay knows it (the database it read the row from), never as the row
/// says: a consumer checks it against the message's type.
pub const PRODUCER: &str = "producer";

/// The headers repeating the body's `correlation_id` (the saga the record
/// belongs to) and `causation_id` (the event whose handling produced it),
/// when it has them: a reader's span and logs carry them without decoding
/// the body.
pub const CORRELATION_ID: &str = "correlation_id";
/// See [`CORRELATION_ID`].
pub const CAUSATION_ID: &str = "causation_id";

/// The body's correlation and causation ids, if it is JSON with them.
#[derive(serde::Deserialize, Default)]
struct Causality {
    correlation_id: Option<String>,
    causation_id: Option<String>,
}

/// `headers` with [`CORRELATION_ID`] and [`CAUSATION_ID`] from `body`, as
/// far as it has them (a body that is not such JSON adds none).
pub fn causality(headers: OwnedHeaders, body: &str) -> OwnedHeaders {
    let ids: Causality = serde_json::from_str(body).unwrap_or_default();
    let mut headers = headers;
    for (key, value) in [(CORRELATION_ID, &ids.correlation_id), (CAUSATION_ID, &ids.causation_id)] {
        if let Some(value) = value {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_str()),
            });
        }
    }
    headers
}

/// A [`Publisher`] over rdkafka's idempotent producer.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    trace: TraceLink,
    stamp: Option<&'static str>,
}

impl KafkaPublisher {
    /// A publisher for `brokers` (a comma-separated `host:port` list), its
    /// messages failing after 15 s without an acknowledgement.
    pub fn new(brokers: &str) -> KafkaResult<Self> {
        Self::with_timeout(brokers, Duration::from_secs(15))
    }

    /// A publisher whose messages fail after `timeout` without a broker
    /// acknowledgement (the row then stays pending and is retried).
    pub fn with_timeout(brokers: &str, timeout: Duration) -> KafkaResult<Self> {
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", brokers);
        Ok(Self::from_producer(idempotent_producer(base, timeout)?))
    }

    /// A publisher over an existing producer (e.g. one built with the
    /// client settings of a service; see [`idempotent_producer`]).
    pub fn from_producer(producer: FutureProducer) -> Self {
        Self {
            producer,
            trace: pass_through,
            stamp: None,
        }
    }

    /// The same publisher, stamping every record with `producer` in the
    /// [`PRODUCER`] header: the service that owns the outbox this
    /// publisher relays.
    pub fn stamp_producer(self, producer: &'static str) -> Self {
        Self {
            stamp: Some(producer),
            ..self
        }
    }

    /// The same publisher, linking each row's publish span with `link`.
    pub fn trace_with(self, link: TraceLink) -> Self {
        Self { trace: link, ..self }
    }
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        let sends = rows.iter().map(|row| {
            // One producer span per row, a child of the span that wrote it;
            // the headers carry this span, so the consumer is its child.
            let span = tracing::info_span!(
                "outbox.publish",
                otel.name = %format_args!("{} publish", row.topic),
                otel.kind = "producer",
                messaging.system = "kafka",
                messaging.destination.name = %row.topic,
                messaging.message.id = %row.event_id,
                event_type = %row.event_type,
            );
            let traceparent = (self.trace)(&span, row.traceparent.as_deref());
            // The identity fixed when the row was written, on every copy.
            let (event_id, body) = (row.event_id.clone(), row.body.clone());
            #[cfg(feature = "negative-controls")]
            let (event_id, body) = crate::negative_controls::identity(event_id, body);
            let mut headers = causality(headers(&event_id, &row.event_type, traceparent.as_deref()), &body);
            if let Some(producer) = self.stamp {
                headers = stamp(headers, producer);
            }
            let (producer, topic, key) = (&self.producer, &row.topic, &row.key);
            #[cfg(feature = "negative-controls")]
            let unsent = crate::negative_controls::leave_unsent();
            #[cfg(not(feature = "negative-controls"))]
            let unsent = false;
            async move {
                if unsent {
                    return Ok(());
                }
                publish(producer, topic, key, body.as_bytes(), headers).await
            }
            .instrument(span)
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .map(|r| r.map_err(refusal))
            .collect()
    }
}

/// What the relay does with a failed send: a record the broker refuses for
/// its size or shape never gets through (the row is parked); anything else
/// may (it stays pending).
fn refusal(e: KafkaError) -> PublishError {
    let retriable = !matches!(
        e,
        KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
        )
    );
    PublishError {
        retriable,
        message: format!("kafka: {e}"),
    }
}

/// `headers` with the [`PRODUCER`] header set to `producer`.
pub fn stamp(headers: OwnedHeaders, producer: &str) -> OwnedHeaders {
    headers.insert(Header {
        key: PRODUCER,
        value: Some(producer),
    })
}

/// The idempotent producer on top of `base` (a client configuration):
/// `enable.idempotence=true` implies `acks=all` and lets the broker drop the
/// duplicates *it* would create on internal retries. It cannot drop a
/// republish of the same outbox row after a relay crash — that is the
/// inbox's job.
pub fn idempotent_producer(mut base: ClientConfig, timeout: Duration) -> KafkaResult<FutureProducer> {
    base.set("enable.idempotence", "true");
    #[cfg(feature = "negative-controls")]
    crate::negative_controls::producer_settings(&mut base);
    with_delivery_settings(base, timeout).create()
}

/// `acks=all`, the linger of `base` (0 unless set) and a delivery timeout
/// of `timeout`.
pub fn with_delivery_settings(mut base: ClientConfig, timeout: Duration) -> ClientConfig {
    let linger = base.get("linger.ms").unwrap_or("0").to_owned();
    base.set("acks", "all")
        // No lingering unless the base says otherwise: a lone outbox row
        // goes out at once; batches still form while requests are in flight.
        .set("linger.ms", linger)
        .set("message.timeout.ms", timeout.as_millis().to_string());
    base
}

/// The identity headers of a record: `event_id`, `event_type` and, when the
/// row has one, `traceparent`.
pub fn headers(event_id: &str, event_type: &str, traceparent: Option<&str>) -> OwnedHeaders {
    let mut h = OwnedHeaders::new()
        .insert(Header {
            key: EVENT_ID,
            value: Some(event_id),
        })
        .insert(Header {
            key: EVENT_TYPE,
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

/// Publishes one serialised message and waits for the broker's delivery report.
pub async fn publish(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    body: &[u8],
    headers: OwnedHeaders,
) -> KafkaResult<()> {
    let record = FutureRecord::to(topic).key(key).payload(body).headers(headers);
    producer
        .send(record, Timeout::After(Duration::from_secs(5)))
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_too_large_or_malformed_is_parked_anything_else_retried() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidMessageSize,
            RDKafkaErrorCode::InvalidMessage,
        ] {
            assert!(!refusal(KafkaError::MessageProduction(code)).retriable, "{code:?}");
        }
        let timeout = refusal(KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut));
        assert!(timeout.retriable);
        assert!(timeout.message.starts_with("kafka: "), "{}", timeout.message);
    }

    #[test]
    fn the_row_identity_travels_in_headers() {
        use rdkafka::message::Headers as _;
        let h = headers("id-1", "StockReserved", Some("00-abc-def-01"));
        let pairs: Vec<_> = h
            .iter()
            .map(|h| (h.key.to_owned(), String::from_utf8(h.value.unwrap().to_vec()).unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("event_id".to_owned(), "id-1".to_owned()),
                ("event_type".to_owned(), "StockReserved".to_owned()),
                ("traceparent".to_owned(), "00-abc-def-01".to_owned())
            ]
        );
        assert_eq!(
            headers("id-1", "T", None).count(),
            2,
            "no traceparent header without one"
        );
    }
}
