//! The negative control `UNSAFE_OFFSET_BEFORE_HANDLING`
//! (`kafka::negative_controls::ack_first`): with the offset committed
//! before the handler runs, a consumer that stops in the middle of a
//! message never gets it again — the loss the suite's
//! `offset-before-handling` run must catch. Its own binary: the control is
//! set for the whole process.

#[path = "../common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, Handled, Traced};
use kafka::KafkaArgs;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_before_handling_a_message_interrupted_mid_handling_is_never_redelivered() {
    kafka::negative_controls::ack_first();
    let broker = testkit::broker::shared().await.unwrap();
    let topic = format!("ack-first-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    // The message, then a marker behind it in the same partition (same key).
    let order = Uuid::new_v4();
    let lost = Envelope::new(order, &Message::ReleaseStock, None);
    let marker = Envelope::new(order, &Message::ReleaseStock, None);
    let producer = kafka::producer(&broker).unwrap();
    for env in [&lost, &marker] {
        common::publish(&producer, &topic, env).await.unwrap();
    }
    let settings = ConsumerSettings {
        kafka: KafkaArgs::new(broker.clone()),
        group_id: format!("ack-first.{topic}"),
        topics: vec![topic.clone()],
        max_batch: 1,
    };

    // First consumer: it dies while its handler is in the middle of the
    // message (the task is dropped, as a process is killed).
    let (started, first) = (Arc::new(AtomicUsize::new(0)), CancellationToken::new());
    let seen = started.clone();
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings.clone(),
        first.clone(),
        move |_: Vec<Traced<Envelope>>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(120)).await;
                Ok(vec![Handled::Applied])
            }
        },
    ));
    let end = Instant::now() + Duration::from_secs(30);
    while started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < end, "the message never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.abort();
    let _ = run.await;
    // What it left running (its lag gauge) lets go of the consumer too.
    first.cancel();

    // Its successor in the group, once the dead member's session is over,
    // reads from the committed offset: acknowledged before it was handled,
    // the message is behind it — only the marker comes.
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let (token, seen) = (CancellationToken::new(), delivered.clone());
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            seen.lock().unwrap().extend(batch.iter().map(|t| t.message.event_id));
            async move { Ok(vec![Handled::Applied; batch.len()]) }
        },
    ));
    let end = Instant::now() + Duration::from_secs(60);
    while !delivered.lock().unwrap().contains(&marker.event_id) {
        assert!(Instant::now() < end, "the marker never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        *delivered.lock().unwrap(),
        [marker.event_id],
        "acknowledged first, the interrupted message is lost: never delivered again"
    );
}
