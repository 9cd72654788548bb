//! Consumer groups: members share a topic's partitions, and a partition
//! that moves is handed over with what its lane handled committed — the
//! new owner starts after it, so nothing is handled twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use contract::{Envelope, Message};
use uuid::Uuid;

use super::{spawn_paced, World};

/// Sends `n` events of distinct orders (spread over the partitions) with one producer.
async fn send(world: &World, n: usize) {
    let producer = kafka::producer(&world.broker).unwrap();
    for _ in 0..n {
        let env = Envelope::new(Uuid::new_v4(), &Message::ReleaseStock, None);
        super::publish(&producer, &world.topic, &env).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_partitions_and_a_moved_partition_is_never_handled_twice() {
    let w = World::new().await;
    let pace = Duration::from_millis(300);
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (stop_a, done_a) = spawn_paced(&w, "shared", a.clone(), pace);
    send(&w, 12).await;
    w.wait_effects(12).await;
    assert_eq!(a.load(Ordering::SeqCst), 12, "one member handles everything");

    // A backlog for a (about 30 messages per partition, 9 s of work each),
    // then a second member joins: the cooperative rebalance (a few seconds)
    // moves a partition from a to b while a's lane is in the middle of a
    // message — which must be finished and committed before b starts.
    send(&w, 90).await;
    let (stop_b, done_b) = spawn_paced(&w, "shared", b.clone(), pace);
    w.wait_effects(102).await;
    let (by_a, by_b) = (a.load(Ordering::SeqCst), b.load(Ordering::SeqCst));
    eprintln!("after the join: a handled {by_a}, b {by_b}");
    assert!(
        by_b > 0 && by_a > 12,
        "both members handled messages: a {by_a}, b {by_b}"
    );
    assert_eq!(
        by_a + by_b,
        102,
        "a revoked partition's handled messages were committed before it moved (a {by_a}, b {by_b})"
    );

    // b leaves the group cleanly: a takes its partitions from b's commits.
    stop_b.cancel();
    done_b.await.unwrap();
    send(&w, 15).await;
    w.wait_effects(117).await;
    assert_eq!(
        a.load(Ordering::SeqCst) + b.load(Ordering::SeqCst),
        117,
        "nothing handled twice"
    );
    assert_eq!(
        a.load(Ordering::SeqCst),
        by_a + 15,
        "the remaining member handled the rest"
    );
    stop_a.cancel();
    done_a.await.unwrap();
    let distinct: i64 = sqlx::query_scalar("SELECT count(DISTINCT event_id) FROM effects")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(distinct, 117);
    w.drop().await;
}

/// A static member fenced by another member with its `group.instance.id`
/// (what a coordinator failover can do to a restarted service's consumer)
/// is a fatal error in librdkafka. The consume loop builds a new consumer
/// in-process and goes on, counted in `consumer_rebuilds_total`: the
/// service does not end because the broker side changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_static_member_is_rebuilt_in_process_and_goes_on() {
    let w = World::new().await;
    let group = w.group("fenced");
    let mut settings = w.settings("fenced");
    settings.kafka.group_instance_id = Some(format!("{group}-1"));
    let (pool, name) = (w.pool.clone(), group.clone());
    let token = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(kafka::consumer::run(settings.clone(), token.clone(), move |env| {
        let (pool, name) = (pool.clone(), name.clone());
        async move { super::apply(&pool, &name, env).await }
    }));
    send(&w, 3).await;
    w.wait_effects(3).await;

    // An impostor joins with the same instance id: the coordinator hands it
    // the member's place, and the member's next heartbeat is fenced.
    let impostor = kafka::consumer::build(&settings).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let rebuilds = || telemetry::metrics::get("consumer_rebuilds_total", &[("consumer", group.as_str())]);
    while rebuilds() < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the member was never fenced (or the fence was not counted)"
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), impostor.recv()).await;
        assert!(!running.is_finished(), "the consume loop ended: {:?}", running.await);
    }
    drop(impostor);

    // The rebuilt member takes the partitions back and handles what comes.
    send(&w, 4).await;
    w.wait_effects(7).await;
    assert!(!running.is_finished(), "the consume loop must still run");
    token.cancel();
    running.await.unwrap().unwrap();
    let distinct: i64 = sqlx::query_scalar("SELECT count(DISTINCT event_id) FROM effects")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(distinct, 7);
    w.drop().await;
}
