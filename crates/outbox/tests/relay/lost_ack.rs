//! Scenario 18 on the real broker: the broker appends a relay's batch, the
//! acknowledgement never reaches the relay (a fault proxy between them, the
//! broker advertising the proxy, swallows the produce responses), the
//! connection drops and the producer retries the batch. The idempotent
//! producer's retry carries the same producer id and sequence numbers, so
//! the broker keeps one copy; without idempotence (the negative control's
//! switch) the same retry is appended again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox::{KafkaPublisher, Relay};
use testkit::proxy::{FaultProxy, Mode};
use testkit::Broker;
use uuid::Uuid;

use crate::common::{read_all, Db, SERIAL};

/// What one lost-ack round left in the log.
pub struct Outcome {
    /// Copies in the log per event id.
    pub copies: BTreeMap<Uuid, usize>,
    /// Produce responses (chunks) the proxy swallowed.
    pub swallowed: u64,
}

/// One round through the relay's own producer, with idempotence unless this
/// process turned the negative control on (`tests/relay/no_idempotence.rs`,
/// a process of its own).
pub async fn lost_ack_round() -> Outcome {
    let _serial = SERIAL.lock().await;
    let broker_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let proxy = FaultProxy::start(format!("127.0.0.1:{broker_port}")).await.unwrap();
    let proxy_port: u16 = proxy.addr.rsplit(':').next().unwrap().parse().unwrap();
    // Clients are told to reach the broker through the proxy.
    let broker = Broker::start_with(|node| {
        node.port = broker_port;
        node.advertised_port = proxy_port;
    })
    .await
    .unwrap();
    let db = Db::new().await;
    let topic = format!("lost-ack-{}", Uuid::new_v4().simple());
    testkit::topics::create(&broker.addr, &[&topic], 3).await.unwrap();

    // The relay's own producer (`outbox::kafka::idempotent_producer`, which
    // outbox-relay's `KafkaArgs::producer` builds on), with the service's
    // socket timeout and reconnect backoff.
    let mut base = rdkafka::ClientConfig::new();
    base.set("bootstrap.servers", &proxy.addr)
        .set("socket.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", "1000");
    let producer = outbox::kafka::idempotent_producer(base, Duration::from_secs(15)).unwrap();
    let relay = std::sync::Arc::new(Relay::new(
        db.pool.clone(),
        KafkaPublisher::from_producer(producer),
        "lost-ack",
    ));
    // A first row through a healthy path: metadata, connection and producer id are in place.
    db.enqueue(&topic, Uuid::new_v4(), 0).await;
    assert_eq!(relay.run_once().await.unwrap().published, 1);

    for i in 1..=20 {
        db.enqueue(&topic, Uuid::new_v4(), i).await;
    }
    proxy.set(Mode::SwallowResponses);
    let before = proxy.acted();
    let round = tokio::spawn({
        let relay = relay.clone();
        async move { relay.run_once().await }
    });
    // The batch reached the broker (its response was swallowed) …
    let end = Instant::now() + Duration::from_secs(20);
    while proxy.acted() == before {
        assert!(Instant::now() < end, "no produce response came back to swallow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let swallowed = proxy.acted() - before;
    // … then the connection drops, and the producer retries on a new one.
    proxy.set(Mode::Reset);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Mode::Pass);
    let round = round.await.unwrap().unwrap();
    assert_eq!(round.published + round.failed, 20, "{round:?}");
    // Whatever failed for good in that round goes out in the next ones.
    let end = Instant::now() + Duration::from_secs(30);
    while db.pending().await > 0 {
        assert!(Instant::now() < end, "rows stayed pending");
        relay.run_once().await.unwrap();
    }
    let mut copies = BTreeMap::new();
    for (_, env) in read_all(&broker.addr, &topic).await {
        *copies.entry(env.event_id).or_insert(0) += 1;
    }
    assert_eq!(copies.len(), 21, "every row reached the log");
    db.drop().await;
    Outcome { copies, swallowed }
}
