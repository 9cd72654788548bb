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
    );
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
