//! One order is one trace: the span a consumed message is handled in is a
//! child of the span that published it (its `traceparent` header). Its own
//! binary: it installs the process's tracing subscriber.

#[path = "../common/mod.rs"]
mod common;

use std::time::Duration;

use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, Handled, Traced};
use kafka::KafkaArgs;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumed_message_is_handled_in_a_child_of_the_span_that_published_it() {
    let _tracing = telemetry::init(&telemetry::Settings {
        service: "kafka-test",
        filter: "info".into(),
        json: false,
        otlp_endpoint: None,
        sample_ratio: 1.0,
        disabled: false,
    })
    .unwrap();
    let broker = testkit::broker::shared().await.unwrap();
    let topic = format!("traces-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let published_by = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let mut env = Envelope::new(Uuid::new_v4(), &Message::ReleaseStock, None);
    env.traceparent = Some(published_by.clone());
    let producer = kafka::producer(&broker).unwrap();
    common::publish(&producer, &topic, &env).await.unwrap();

    let (seen, mut handled) = tokio::sync::mpsc::unbounded_channel();
    let token = CancellationToken::new();
    let settings = ConsumerSettings {
        kafka: KafkaArgs::new(broker.clone()),
        group_id: format!("traces.{topic}"),
        topics: vec![topic.clone()],
        max_batch: 1,
    };
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            for item in &batch {
                let _ = seen.send(telemetry::propagation::traceparent(&item.span));
            }
            async move { Ok(vec![Handled::Applied; batch.len()]) }
        },
    ));
    let traceparent = tokio::time::timeout(Duration::from_secs(30), handled.recv())
        .await
        .expect("the message was handled")
        .unwrap()
        .expect("the handling span belongs to a trace");
    token.cancel();
    run.await.unwrap().unwrap();
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "the consume span continues the publisher's trace: {traceparent}"
    );
    assert!(!traceparent.contains("00f067aa0ba902b7"), "as a child span of its own");
}
