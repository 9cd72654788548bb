//! The consumer's crash points sit in the correct code's windows and fire
//! only where there is something to lose (issue 41): the one after a
//! batch's transaction and before its offset only after a batch that
//! applied something. Counted with a callback in place of the abort. Its
//! own binary: fail points are process-wide.

#[path = "../common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, Handled, Traced, CRASH_BEFORE_OFFSET_COMMIT};
use kafka::KafkaArgs;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_before_offset_crash_point_is_reached_only_after_a_batch_that_applied_something() {
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = reached.clone();
    fail::cfg_callback(CRASH_BEFORE_OFFSET_COMMIT, move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let broker = testkit::broker::shared().await.unwrap();
    let topic = format!("crash-points-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    let producer = kafka::producer(&broker).unwrap();
    let send = |env: Envelope| {
        let (producer, topic) = (producer.clone(), topic.clone());
        async move { common::publish(&producer, &topic, &env).await.unwrap() }
    };
    // The handler applies an event the first time and reports every copy
    // after that as a duplicate, as an inbox would.
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let handled = Arc::new(AtomicUsize::new(0));
    let (token, settings) = (
        CancellationToken::new(),
        ConsumerSettings {
            kafka: KafkaArgs::new(broker.clone()),
            group_id: format!("crash-points.{topic}"),
            topics: vec![topic.clone()],
            max_batch: 1,
        },
    );
    let (s, h) = (seen.clone(), handled.clone());
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            let outcomes: Vec<Handled> = batch
                .iter()
                .map(|t| match s.lock().unwrap().insert(t.message.event_id) {
                    // A new reply the saga's state machine would stop: its
                    // inbox row commits, nothing else is applied.
                    true if t.message.event_type == "StockReserved" => Handled::Ignored,
                    true => Handled::Applied,
                    false => Handled::Duplicate,
                })
                .collect();
            h.fetch_add(batch.len(), Ordering::SeqCst);
            async move { Ok(outcomes) }
        },
    ));
    let wait_handled = |n: usize| {
        let handled = handled.clone();
        async move {
            let end = Instant::now() + Duration::from_secs(30);
            while handled.load(Ordering::SeqCst) < n {
                assert!(
                    Instant::now() < end,
                    "only {} of {n} handled",
                    handled.load(Ordering::SeqCst)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let event = Envelope::new(Uuid::new_v4(), &Message::ReleaseStock, None);
    send(event.clone()).await;
    wait_handled(1).await;
    assert_eq!(
        reached.load(Ordering::SeqCst),
        1,
        "a batch that applied its event reaches it"
    );
    // The same event again: a batch of duplicates has nothing to lose.
    send(event.clone()).await;
    send(event).await;
    wait_handled(3).await;
    assert_eq!(
        reached.load(Ordering::SeqCst),
        1,
        "batches of duplicates never reach it"
    );
    // New to the inbox but ignored: its row committed, so its redelivery
    // would be absorbed — the window is open as after an applied one.
    send(Envelope::new(Uuid::new_v4(), &Message::StockReserved, None)).await;
    wait_handled(4).await;
    assert_eq!(
        reached.load(Ordering::SeqCst),
        2,
        "a batch whose event was new but ignored reaches it"
    );
    token.cancel();
    run.await.unwrap().unwrap();

    // A batch of three that one message makes fail for good: handled again
    // one message at a time, two applied, the third dead-lettered — what
    // was applied that way reaches the point once, after the batch.
    let topic = format!("crash-points-batch-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    let order = Uuid::new_v4();
    let poison = Envelope::new(order, &Message::StockReserved, None);
    for env in [
        Envelope::new(order, &Message::ReleaseStock, None),
        poison.clone(),
        Envelope::new(order, &Message::ReleaseStock, None),
    ] {
        common::publish(&producer, &topic, &env).await.unwrap();
    }
    let settings = ConsumerSettings {
        kafka: KafkaArgs::new(broker.clone()),
        group_id: format!("crash-points-batch.{topic}"),
        topics: vec![topic.clone()],
        max_batch: 16,
    };
    let (applied, largest) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, l, token) = (applied.clone(), largest.clone(), CancellationToken::new());
    let poison_id = poison.event_id;
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            l.fetch_max(batch.len(), Ordering::SeqCst);
            let refused = batch.iter().any(|t| t.message.event_id == poison_id);
            if !refused {
                a.fetch_add(batch.len(), Ordering::SeqCst);
            }
            let n = batch.len();
            async move {
                if refused {
                    return Err(kafka::consumer::HandleError::permanent("this one never applies"));
                }
                Ok(vec![Handled::Applied; n])
            }
        },
    ));
    let end = Instant::now() + Duration::from_secs(30);
    while applied.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < end, "the batch's good messages were not applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(largest.load(Ordering::SeqCst), 3, "the three came as one batch");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        3,
        "a batch handled one message at a time that applied some reaches it, once"
    );
    fail::remove(CRASH_BEFORE_OFFSET_COMMIT);
}
