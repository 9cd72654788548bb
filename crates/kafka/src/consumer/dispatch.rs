//! What the dispatcher decides per message: which lane takes it (a new one
//! when its partition's lane is gone), and the span it is handled in.

use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::Message as _;
use tokio::sync::mpsc;

/// Whether a message of a partition needs a new lane: none was started,
/// the one started has stopped (its queue closed), or the partition's lane
/// is no longer registered (revoked, even if its queue is still open while
/// it finishes its message — a message sent there would be dropped).
pub(super) fn needs_new_lane<M>(queue: Option<&mpsc::Sender<M>>, registered: bool) -> bool {
    queue.is_none_or(|q| q.is_closed()) || !registered
}

/// The span a message is handled in: a child of the span that published it
/// (its `traceparent` header), so one order is one trace across services.
pub(super) fn consume_span(consumer: &str, msg: &OwnedMessage) -> tracing::Span {
    let span = tracing::info_span!(
        "consume",
        otel.name = %format_args!("{} process", msg.topic()),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.destination.name = %msg.topic(),
        messaging.consumer.group.name = %consumer,
        messaging.destination.partition.id = msg.partition(),
        messaging.kafka.offset = msg.offset(),
        correlation_id = tracing::field::Empty,
        causation_id = tracing::field::Empty,
    );
    // The saga and the cause, from the headers the relay copied out of the
    // body: every log line and span of the handling carries them.
    for key in [outbox::kafka::CORRELATION_ID, outbox::kafka::CAUSATION_ID] {
        if let Some(id) = header(msg, key) {
            span.record(key, id);
        }
    }
    telemetry::propagation::follow(&span, header(msg, telemetry::propagation::TRACEPARENT));
    span
}

/// The value of `msg`'s header `key`, if it has one in UTF-8.
pub(super) fn header<'m>(msg: &'m OwnedMessage, key: &str) -> Option<&'m str> {
    msg.headers().and_then(|headers| {
        headers
            .iter()
            .find(|h| h.key == key)
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The consume span carries the record's correlation and causation ids
    /// (the headers the relay copies out of the body). Removal tried: the
    /// recording loop dropped — this failed.
    #[test]
    fn the_consume_span_carries_the_correlation_and_causation_headers() {
        use rdkafka::message::{Header, OwnedHeaders};
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt as _;

        #[derive(Clone, Default)]
        struct Fields(Arc<Mutex<Vec<(String, String)>>>);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.lock().unwrap().push((f.name().to_owned(), format!("{v:?}")));
            }
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                self.0.lock().unwrap().push((f.name().to_owned(), v.to_owned()));
            }
        }
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Fields {
            fn on_record(
                &self,
                _: &tracing::span::Id,
                values: &tracing::span::Record<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                values.record(&mut self.clone());
            }
        }
        let fields = Fields::default();
        let subscriber = tracing_subscriber::registry().with(fields.clone());
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: outbox::kafka::CORRELATION_ID,
                value: Some("the-saga"),
            })
            .insert(Header {
                key: outbox::kafka::CAUSATION_ID,
                value: Some("the-cause"),
            });
        let msg = OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"k".to_vec()),
            "t".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            7,
            Some(headers),
        );
        tracing::subscriber::with_default(subscriber, || {
            let _span = consume_span("c", &msg);
        });
        let got = fields.0.lock().unwrap().clone();
        assert!(got.contains(&("correlation_id".into(), "the-saga".into())), "{got:?}");
        assert!(got.contains(&("causation_id".into(), "the-cause".into())), "{got:?}");
    }

    #[test]
    fn a_partition_gets_a_new_lane_unless_its_lane_is_running_and_registered() {
        let (open, _rx) = mpsc::channel::<()>(1);
        let (closed, rx) = mpsc::channel::<()>(1);
        drop(rx);
        assert!(needs_new_lane::<()>(None, false), "never started");
        assert!(needs_new_lane(Some(&closed), true), "stopped");
        assert!(
            needs_new_lane(Some(&open), false),
            "revoked, still finishing its message: a new lane, not the old queue"
        );
        assert!(!needs_new_lane(Some(&open), true), "running");
    }
}
