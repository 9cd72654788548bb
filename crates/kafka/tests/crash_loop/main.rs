//! Poison by behaviour, across restarts (issue 59): a message whose
//! handling aborts the process is dead-lettered once it has killed
//! `KAFKA_CONSUMER_MAX_CRASHES` lives, and the partition moves on. The
//! consumer runs in a child process (this binary again, its `child` test)
//! that `abort()`s on the poison; the test restarts it as a supervisor
//! would, up to a bound, and reads the dead-letter topic.

#[path = "../common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, Handled, Traced};
use kafka::KafkaArgs;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The lives the poison may take (`KAFKA_CONSUMER_MAX_CRASHES`) in the child.
const MAX_CRASHES: u32 = 2;
/// Restarts the test allows before it calls the loop endless.
const LIVES: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_consumer_is_dead_lettered_after_its_lives_and_the_partition_moves_on() {
    let broker = testkit::broker::shared().await.unwrap();
    let topic = format!("crash-loop-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    let producer = kafka::producer(&broker).unwrap();
    // One order, so one partition: before, the poison, after.
    let order = Uuid::new_v4();
    let envelopes: Vec<Envelope> = (0..3)
        .map(|_| Envelope::new(order, &Message::ReleaseStock, None))
        .collect();
    for env in &envelopes {
        common::publish(&producer, &topic, env).await.unwrap();
    }
    let (before, poison, after) = (envelopes[0].event_id, envelopes[1].event_id, envelopes[2].event_id);
    let group = format!("crash-loop.{topic}");
    let mut deaths = 0;
    let mut handled = Vec::new();
    let mut finished = false;
    for _ in 0..LIVES {
        let exe = std::env::current_exe().unwrap();
        let (broker, topic, group) = (broker.clone(), topic.clone(), group.clone());
        let out = tokio::task::spawn_blocking(move || {
            Command::new(exe)
                .args(["--exact", "child", "--ignored", "--nocapture", "--test-threads=1"])
                .env("EO_CRASH_LOOP_BROKER", broker)
                .env("EO_CRASH_LOOP_TOPIC", topic)
                .env("EO_CRASH_LOOP_GROUP", group)
                .env("EO_CRASH_LOOP_POISON", poison.to_string())
                .env("EO_CRASH_LOOP_LAST", after.to_string())
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        // libtest writes its own words on the line before the child's.
        handled.extend(
            stdout
                .lines()
                .filter_map(|l| l.split("handled ").nth(1))
                .map(str::to_owned),
        );
        if out.status.success() {
            finished = true;
            break;
        }
        deaths += 1;
    }
    assert!(
        finished,
        "the consumer still died after {LIVES} lives: the poison was never dead-lettered"
    );
    // The first life may die on a batch, before the mark is narrowed to the poison.
    assert!(
        (MAX_CRASHES as usize..=MAX_CRASHES as usize + 1).contains(&deaths),
        "{deaths} lives died, {MAX_CRASHES} expected (+1 for a batch)"
    );
    let letters = kafka::dlq::list(&broker, &topic).unwrap();
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    let letter: Envelope = serde_json::from_slice(&letters[0].payload).unwrap();
    assert_eq!(letter.event_id, poison, "the poison is the dead letter");
    let error = letters[0].error.clone().unwrap_or_default();
    assert!(error.contains("killed its consumer"), "{error}");
    for id in [before, after] {
        assert!(handled.contains(&id.to_string()), "{id} handled: {handled:?}");
    }
    assert!(!handled.contains(&poison.to_string()), "the poison never returned");
}

/// The consumer of the test above, run as its own process: aborts on the
/// poison, prints each message it handled, and stops cleanly once the last
/// one is handled. Does nothing outside that test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of the crash-loop test"]
async fn child() {
    let Ok(broker) = std::env::var("EO_CRASH_LOOP_BROKER") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let (poison, last) = (var("EO_CRASH_LOOP_POISON"), var("EO_CRASH_LOOP_LAST"));
    let mut kafka = KafkaArgs::new(broker);
    kafka.consumer_max_crashes = MAX_CRASHES;
    let settings = ConsumerSettings {
        kafka,
        group_id: var("EO_CRASH_LOOP_GROUP"),
        topics: vec![var("EO_CRASH_LOOP_TOPIC")],
        max_batch: 32,
    };
    let token = CancellationToken::new();
    let stop = token.clone();
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            for t in &batch {
                let id = t.message.event_id.to_string();
                if id == poison {
                    std::process::abort();
                }
                println!("handled {id}");
                if id == last {
                    stop.cancel();
                }
            }
            async move { Ok(vec![Handled::Applied; batch.len()]) }
        },
    ));
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the last message handled within a minute")
        .unwrap()
        .unwrap();
}
