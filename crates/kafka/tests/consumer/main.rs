//! The consume loop with an inbox-backed handler, over a real Apache Kafka broker
//! and a real PostgreSQL: the contract test of seed 003, dead letters,
//! offsets committed only after the transaction, transient retries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, HandleError, Handled, Traced};
use kafka::KafkaArgs;
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use sqlx::PgPool;
use testkit::TempDb;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[path = "../common/mod.rs"]
mod common;
mod group;
mod topics;

use common::publish;

struct World {
    /// The test binary's shared broker: no test here stops it, and each has
    /// a topic, a dead-letter topic and consumer groups of its own.
    broker: String,
    pool: PgPool,
    /// Dropped with this value, also when the test panics.
    _db: TempDb,
    topic: String,
}

impl World {
    async fn new() -> Self {
        let broker = testkit::broker::shared().await.unwrap();
        let effects = "CREATE TABLE effects (event_id uuid NOT NULL, order_id uuid NOT NULL, \
                       applied_at timestamptz DEFAULT clock_timestamp())";
        let (db, pool) = TempDb::with_tables("eo_consumer", vec![inbox::migrator()], effects)
            .await
            .unwrap();
        let topic = format!("consumer-test-{}", Uuid::new_v4().simple());
        kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
        Self {
            broker,
            pool,
            _db: db,
            topic,
        }
    }

    fn settings(&self, group: &str) -> ConsumerSettings {
        ConsumerSettings {
            kafka: KafkaArgs::new(self.broker.clone()),
            group_id: self.group(group),
            topics: vec![self.topic.clone()],
            max_batch: 1,
        }
    }

    /// The group id of `name` in this test: one group per test on the shared broker.
    fn group(&self, name: &str) -> String {
        format!("{name}.{}", self.topic)
    }

    async fn send_raw(&self, key: &str, body: &[u8]) {
        let producer = kafka::producer(&self.broker).unwrap();
        producer
            .send(
                FutureRecord::to(&self.topic).key(key).payload(body),
                Timeout::After(Duration::from_secs(5)),
            )
            .await
            .unwrap();
    }

    async fn send(&self, env: &Envelope) {
        let producer = kafka::producer(&self.broker).unwrap();
        publish(&producer, &self.topic, env).await.unwrap();
    }

    async fn effects(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM effects")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn wait_effects(&self, n: i64) {
        let end = Instant::now() + Duration::from_secs(30);
        while self.effects().await < n {
            assert!(Instant::now() < end, "only {} of {n} effects", self.effects().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await; // nothing more arrives
    }

    /// Closes the pool; the database goes with `_db`.
    async fn drop(self) {
        self.pool.close().await;
    }
}

/// The effect: one row per applied event, recorded with the inbox row.
async fn apply(pool: &PgPool, consumer: &str, env: Envelope) -> Result<Handled, HandleError> {
    env.message().map_err(HandleError::permanent)?;
    let mut tx = pool.begin().await.map_err(HandleError::transient)?;
    if inbox::record(&mut tx, consumer, env.event_id)
        .await
        .map_err(HandleError::transient)?
        == inbox::Recorded::Duplicate
    {
        return Ok(Handled::Duplicate);
    }
    sqlx::query("INSERT INTO effects (event_id, order_id) VALUES ($1, $2)")
        .bind(env.event_id)
        .bind(env.order_id)
        .execute(&mut *tx)
        .await
        .map_err(HandleError::transient)?;
    tx.commit().await.map_err(HandleError::transient)?;
    Ok(Handled::Applied)
}

fn spawn_consumer(
    world: &World,
    group: &str,
    calls: Arc<AtomicUsize>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    spawn_paced(world, group, calls, Duration::ZERO)
}

/// A consumer of `group` whose handler takes `pace` per message before its
/// effect (so that a batch can be in flight when something happens) and
/// counts its calls.
fn spawn_paced(
    world: &World,
    group: &str,
    calls: Arc<AtomicUsize>,
    pace: Duration,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let pool = world.pool.clone();
    let name = group.to_owned();
    let handle = tokio::spawn(kafka::consumer::run(world.settings(group), token.clone(), move |env| {
        let (pool, name, calls) = (pool.clone(), name.clone(), calls.clone());
        async move {
            tokio::time::sleep(pace).await;
            calls.fetch_add(1, Ordering::SeqCst);
            apply(&pool, &name, env).await
        }
    }));
    (token, tokio::spawn(async move { handle.await.unwrap().unwrap() }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_event_twice_is_one_effect_equal_payloads_are_two() {
    let w = World::new().await;
    let order = Uuid::new_v4();
    let event = Envelope::new(order, &Message::ReleaseStock, None);
    // Equal payload, equal time, equal order: a timestamp is not an identity.
    let mut twin = Envelope::new(order, &Message::ReleaseStock, None);
    twin.occurred_at = event.occurred_at;
    twin.correlation_id = event.correlation_id;
    assert_eq!(
        (&event.payload, event.occurred_at, &event.event_type),
        (&twin.payload, twin.occurred_at, &twin.event_type)
    );
    assert_ne!(event.event_id, twin.event_id);
    w.send(&event).await;
    w.send(&event).await; // redelivered / republished: same event_id
    w.send(&twin).await; // an equal payload, a different event
    let group = w.group("contract");
    let before = telemetry::metrics::get("consumer_duplicates_absorbed_total", &[("consumer", &group)]);
    let (token, done) = spawn_consumer(&w, "contract", Arc::default());
    w.wait_effects(2).await;
    token.cancel();
    done.await.unwrap();
    assert_eq!(w.effects().await, 2, "one effect per event id");
    let absorbed = telemetry::metrics::get("consumer_duplicates_absorbed_total", &[("consumer", &group)]) - before;
    assert_eq!(absorbed, 1.0, "the redelivery was counted as absorbed");
    // Several consumers of one event each dedup on their own (scenario 5).
    let (token, done) = spawn_consumer(&w, "another-consumer", Arc::default());
    w.wait_effects(4).await;
    token.cancel();
    done.await.unwrap();
    assert_eq!(w.effects().await, 4);
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_goes_to_the_dead_letter_topic_and_the_partition_moves_on() {
    let w = World::new().await;
    let order = Uuid::new_v4();
    // Same key → same partition: the poison sits in front of a good message.
    w.send_raw(&order.to_string(), b"{this is not an envelope").await;
    let unknown = serde_json::json!({
        "event_id": Uuid::new_v4(), "event_type": "NoSuchType", "occurred_at": "2026-01-01T00:00:00Z",
        "order_id": order, "correlation_id": order, "causation_id": null, "traceparent": null, "payload": null
    });
    w.send_raw(&order.to_string(), unknown.to_string().as_bytes()).await;
    w.send(&Envelope::new(order, &Message::ReleaseStock, None)).await;
    let (token, done) = spawn_consumer(&w, "poisoned", Arc::default());
    w.wait_effects(1).await;
    token.cancel();
    done.await.unwrap();
    let letters = kafka::dlq::list(&w.broker, &w.topic).unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|l| l.error.as_deref().is_some_and(|e| e.contains("decode"))),
        "{letters:?}"
    );
    assert!(letters
        .iter()
        .all(|l| l.original_topic.as_deref() == Some(w.topic.as_str())));
    assert!(letters
        .iter()
        .all(|l| l.key.as_deref() == Some(order.to_string().as_str())));
    assert_eq!(letters[0].payload, b"{this is not an envelope");
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_committed_after_the_transaction_so_a_restart_resumes() {
    let w = World::new().await;
    for _ in 0..5 {
        w.send(&Envelope::new(Uuid::new_v4(), &Message::ReleaseStock, None))
            .await;
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let (token, done) = spawn_consumer(&w, "resume", calls.clone());
    w.wait_effects(5).await;
    token.cancel();
    done.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    // A restarted consumer starts after the committed offsets.
    w.send(&Envelope::new(Uuid::new_v4(), &Message::ReleaseStock, None))
        .await;
    let (token, done) = spawn_consumer(&w, "resume", calls.clone());
    w.wait_effects(6).await;
    token.cancel();
    done.await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        6,
        "nothing before the committed offset was redelivered"
    );
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_retry_the_same_message_without_skipping_it() {
    let w = World::new().await;
    let order = Uuid::new_v4();
    let first = Envelope::new(order, &Message::ReleaseStock, None);
    let second = Envelope::new(order, &Message::StockReleased, None);
    w.send(&first).await;
    w.send(&second).await;
    let failures = Arc::new(AtomicUsize::new(3));
    let token = CancellationToken::new();
    let pool = w.pool.clone();
    let f = failures.clone();
    let run = tokio::spawn(kafka::consumer::run(w.settings("flaky"), token.clone(), move |env| {
        let (pool, f) = (pool.clone(), f.clone());
        async move {
            if f.load(Ordering::SeqCst) > 0 {
                f.fetch_sub(1, Ordering::SeqCst);
                return Err(HandleError::transient("database restarting"));
            }
            apply(&pool, "flaky", env).await
        }
    }));
    w.wait_effects(2).await;
    token.cancel();
    run.await.unwrap().unwrap();
    let order_of: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM effects ORDER BY applied_at")
        .fetch_all(&w.pool)
        .await
        .unwrap();
    assert_eq!(
        order_of,
        vec![first.event_id, second.event_id],
        "retried in place, in order"
    );
    assert!(
        kafka::dlq::list(&w.broker, &w.topic).unwrap().is_empty(),
        "nothing dead-lettered"
    );
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_failing_is_dead_lettered_after_its_attempts_but_a_dependency_down_waits() {
    let w = World::new().await;
    let order = Uuid::new_v4();
    let (doomed, behind) = (
        Envelope::new(order, &Message::ReleaseStock, None),
        Envelope::new(order, &Message::StockReleased, None),
    );
    w.send(&doomed).await;
    w.send(&behind).await;
    // The database is "down" for the first 6 calls — more than the
    // attempts allowed — then every call for `doomed` fails transiently.
    let mut settings = w.settings("capped");
    settings.kafka.consumer_max_attempts = 4;
    let (calls, doomed_calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let token = CancellationToken::new();
    let (pool, c, d, doomed_id) = (w.pool.clone(), calls.clone(), doomed_calls.clone(), doomed.event_id);
    let run = tokio::spawn(kafka::consumer::run(settings, token.clone(), move |env: Envelope| {
        let (pool, c, d) = (pool.clone(), c.clone(), d.clone());
        async move {
            if c.fetch_add(1, Ordering::SeqCst) < 6 {
                return Err(HandleError::unavailable("connection refused"));
            }
            if env.event_id == doomed_id {
                d.fetch_add(1, Ordering::SeqCst);
                return Err(HandleError::transient("deadlock detected, every time"));
            }
            apply(&pool, "capped", env).await
        }
    }));
    w.wait_effects(1).await;
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        doomed_calls.load(Ordering::SeqCst),
        4,
        "the attempts allowed, then no more"
    );
    let applied: Uuid = sqlx::query_scalar("SELECT event_id FROM effects")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(applied, behind.event_id, "the message behind it was handled");
    let letters = kafka::dlq::list(&w.broker, &w.topic).unwrap();
    assert_eq!(
        letters.len(),
        1,
        "only the doomed one, none while the database was down"
    );
    let error = letters[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("4 attempts") && error.contains("deadlock"), "{error}");
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_message_loop_hands_over_every_message_whatever_the_batch_setting() {
    let w = World::new().await;
    let order = Uuid::new_v4();
    for _ in 0..6 {
        w.send(&Envelope::new(order, &Message::ReleaseStock, None)).await;
    }
    // Queued before the consumer starts, under a batch setting above one:
    // `run` still hands its handler one message at a time, each of them.
    let mut settings = w.settings("one-by-one");
    settings.max_batch = 32;
    let calls = Arc::new(AtomicUsize::new(0));
    let token = CancellationToken::new();
    let (pool, c) = (w.pool.clone(), calls.clone());
    let run = tokio::spawn(kafka::consumer::run(settings, token.clone(), move |env: Envelope| {
        let (pool, c) = (pool.clone(), c.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            apply(&pool, "one-by-one", env).await
        }
    }));
    w.wait_effects(6).await;
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_be_replayed_once_the_cause_is_fixed() {
    let w = World::new().await;
    let event = Envelope::new(Uuid::new_v4(), &Message::ReleaseStock, None);
    w.send(&event).await;
    // First deployment: refuses the message for good.
    let token = CancellationToken::new();
    let run = tokio::spawn(kafka::consumer::run(
        w.settings("fixable"),
        token.clone(),
        |_env: Envelope| async { Err::<Handled, _>(HandleError::Permanent("schema v2 not supported".into())) },
    ));
    let end = Instant::now() + Duration::from_secs(20);
    while kafka::dlq::list(&w.broker, &w.topic).unwrap().is_empty() {
        assert!(Instant::now() < end, "never dead-lettered");
    }
    token.cancel();
    run.await.unwrap().unwrap();
    // Fixed deployment; replay the letter.
    assert_eq!(kafka::dlq::replay(&w.broker, &w.topic).await.unwrap(), 1);
    assert_eq!(
        kafka::dlq::replay(&w.broker, &w.topic).await.unwrap(),
        0,
        "replayed once"
    );
    let (token, done) = spawn_consumer(&w, "fixable", Arc::default());
    w.wait_effects(1).await;
    token.cancel();
    done.await.unwrap();
    let applied: Uuid = sqlx::query_scalar("SELECT event_id FROM effects")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(applied, event.event_id, "same identity after replay");
    w.drop().await;
}

/// The effect of a batch, all-or-nothing: one multi-row inbox insert, one
/// effect row per new event, one commit. Refuses (permanently) any batch
/// that holds a `ChargePayment`, as a handler would a message it can never apply.
async fn apply_batch(pool: &PgPool, consumer: &str, batch: Vec<Envelope>) -> Result<Vec<Handled>, HandleError> {
    if let Some(poison) = batch.iter().find(|e| e.event_type == "ChargePayment") {
        return Err(HandleError::permanent(format!("cannot apply {}", poison.event_id)));
    }
    let mut tx = pool.begin().await.map_err(HandleError::transient)?;
    let ids: Vec<inbox::Delivery> = batch.iter().map(|e| e.event_id.into()).collect();
    let recorded = inbox::record_batch(&mut tx, consumer, &ids)
        .await
        .map_err(HandleError::transient)?;
    let mut handled = Vec::new();
    for (env, recorded) in batch.iter().zip(recorded) {
        if recorded == inbox::Recorded::Duplicate {
            handled.push(Handled::Duplicate);
            continue;
        }
        sqlx::query("INSERT INTO effects (event_id, order_id) VALUES ($1, $2)")
            .bind(env.event_id)
            .bind(env.order_id)
            .execute(&mut *tx)
            .await
            .map_err(HandleError::transient)?;
        handled.push(Handled::Applied);
    }
    tx.commit().await.map_err(HandleError::transient)?;
    Ok(handled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_are_applied_in_batches_in_order_and_one_poison_is_isolated() {
    let w = World::new().await;
    let order = Uuid::new_v4(); // one key: one partition, one lane, one order
    let mut sent = Vec::new();
    for i in 0..40 {
        let env = if i == 17 {
            Envelope::new(
                order,
                &Message::ChargePayment {
                    amount_cents: 100,
                    card: "4242".into(),
                },
                None,
            )
        } else {
            Envelope::new(order, &Message::ReleaseStock, None)
        };
        w.send(&env).await;
        if i == 9 {
            w.send(&env).await; // a redelivery right behind the original, likely in one batch
        }
        sent.push(env);
    }
    let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let token = CancellationToken::new();
    let (pool, seen) = (w.pool.clone(), sizes.clone());
    let mut settings = w.settings("batched");
    settings.max_batch = 8;
    let run = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            let (pool, seen) = (pool.clone(), seen.clone());
            let batch: Vec<Envelope> = batch.into_iter().map(|t| t.message).collect();
            async move {
                seen.lock().unwrap().push(batch.len());
                apply_batch(&pool, "batched", batch).await
            }
        },
    ));
    w.wait_effects(39).await;
    token.cancel();
    run.await.unwrap().unwrap();
    let sizes = sizes.lock().unwrap().clone();
    assert!(sizes.iter().all(|s| *s <= 8), "max_batch honoured: {sizes:?}");
    assert!(sizes.iter().any(|s| *s > 1), "queued messages were batched: {sizes:?}");
    let applied: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM effects ORDER BY applied_at")
        .fetch_all(&w.pool)
        .await
        .unwrap();
    let expected: Vec<Uuid> = sent
        .iter()
        .filter(|e| e.event_type != "ChargePayment")
        .map(|e| e.event_id)
        .collect();
    assert_eq!(applied, expected, "each event once, in partition order");
    let letters = kafka::dlq::list(&w.broker, &w.topic).unwrap();
    assert_eq!(letters.len(), 1, "only the poison is dead-lettered: {letters:?}");
    assert!(letters[0].error.as_deref().is_some_and(|e| e.contains("cannot apply")));
    let redeliveries: i64 = sqlx::query_scalar("SELECT coalesce(sum(redeliveries), 0)::int8 FROM inbox_redeliveries")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert!(redeliveries >= 1, "the redelivery was absorbed by the inbox");
    w.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_reads_the_next_minor_and_dead_letters_another_major_or_an_unknown_type() {
    let w = World::new().await;
    let order = Uuid::new_v4();
    let as_json = |env: &Envelope| serde_json::to_value(env).unwrap();
    // 1.1: an added optional field.
    let mut next_minor = as_json(&Envelope::new(order, &Message::ReleaseStock, None));
    next_minor["version"] = "1.9".into();
    next_minor["priority"] = "high".into();
    // 2.0: a major this code does not read.
    let mut next_major = as_json(&Envelope::new(order, &Message::ReleaseStock, None));
    next_major["version"] = "2.0".into();
    // An event type nobody defined.
    let mut unknown = as_json(&Envelope::new(order, &Message::ReleaseStock, None));
    unknown["event_type"] = "StockTeleported".into();
    for v in [&next_major, &unknown, &next_minor] {
        w.send_raw(&order.to_string(), v.to_string().as_bytes()).await;
    }
    let (token, done) = spawn_consumer(&w, "versions", Arc::default());
    w.wait_effects(1).await;
    token.cancel();
    done.await.unwrap();
    let applied: Uuid = sqlx::query_scalar("SELECT event_id FROM effects")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(
        applied.to_string(),
        next_minor["event_id"].as_str().unwrap(),
        "the 1.1 event was applied"
    );
    let letters = kafka::dlq::list(&w.broker, &w.topic).unwrap();
    let reasons: Vec<&str> = letters.iter().filter_map(|l| l.error.as_deref()).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("version \"2.0\""), "{reasons:?}");
    assert!(reasons[1].contains("StockTeleported"), "{reasons:?}");
    w.drop().await;
}
