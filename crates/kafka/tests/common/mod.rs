//! What the Kafka crate's test binaries share (each includes this file).

use contract::Envelope;
use rdkafka::producer::FutureProducer;

/// Puts `envelope` on `topic` as the relay publishes an outbox row: keyed by
/// its order id, identity and trace context as headers.
pub async fn publish(producer: &FutureProducer, topic: &str, envelope: &Envelope) -> kafka::Result<()> {
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
