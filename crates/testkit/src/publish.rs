//! Putting a saga envelope on a topic directly, as the relay would publish
//! its outbox row: keyed by the order id, the envelope as the body, its
//! identity and trace context as headers. Tests and the chaos suite use it to
//! deliver events (and duplicates) without an outbox in between.

use contract::Envelope;
use rdkafka::producer::FutureProducer;

/// Publishes `envelope` to `topic` and waits for the broker's delivery report.
pub async fn envelope(producer: &FutureProducer, topic: &str, envelope: &Envelope) -> kafka::Result<()> {
    let headers = kafka::headers(
        &envelope.event_id.to_string(),
        &envelope.event_type,
        envelope.traceparent.as_deref(),
    );
    kafka::publish(
        producer,
        topic,
        &envelope.order_id.to_string(),
        &envelope.to_bytes(),
        headers,
    )
    .await
}
