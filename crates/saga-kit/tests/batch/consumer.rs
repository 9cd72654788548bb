//! A saga consumer as supervised tasks over a real broker: the batches it
//! hands over are applied once, its inbox retention runs beside it, and a
//! participant's start checks the retention chain and creates the topics.

use std::time::{Duration, Instant};

use clap::Parser as _;
use contract::topics::consumers::Consumer;
use saga_kit::consumer::{begin, commit, SagaConsumer};
use saga_kit::participant::ParticipantArgs;
use service_kit::Supervisor;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{count, effect, reserve, world};

/// The participant's flags, as a service flattens them.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    participant: ParticipantArgs,
}

fn args(brokers: &str, extra: &[&str]) -> ParticipantArgs {
    let mut argv = vec!["test", "--kafka-brokers", brokers, "--kafka-plaintext"];
    argv.extend(extra);
    Cli::try_parse_from(argv).unwrap().participant
}

async fn wait_for(pool: &PgPool, table: &str, n: i64) {
    let end = Instant::now() + Duration::from_secs(60);
    while count(pool, table).await != n {
        assert!(
            Instant::now() < end,
            "{table}: {} rows, not {n}",
            count(pool, table).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_checks_its_chain_and_its_consumer_applies_each_event_once() {
    let brokers = testkit::broker::shared().await.unwrap();
    // A broken retention chain refuses to start, naming the variables.
    let broken = args(&brokers, &["--inbox-retention-secs", "60"]);
    let e = broken.check("saga-kit-test", &[], &[], None).unwrap_err();
    assert!(format!("{e:#}").contains("INBOX_RETENTION_SECS"), "{e:#}");
    let short_key = args(&brokers, &[]).check("saga-kit-test", &[], &[], Some(60));
    assert!(format!("{:#}", short_key.unwrap_err()).contains("GATEWAY_KEY_TTL_SECS"));
    let participant = args(&brokers, &[]);
    participant.check("saga-kit-test", &[], &[], None).unwrap();

    let (_db, pool) = world().await;
    // An inbox row older than the retention window, for the retention task.
    sqlx::query("INSERT INTO inbox (consumer, event_id, processed_at) VALUES ('old', $1, now() - interval '2 days')")
        .bind(Uuid::new_v4())
        .execute(&pool)
        .await
        .unwrap();
    let consumer = Consumer {
        name: "saga-kit-test",
        topic: contract::topics::INVENTORY_COMMANDS,
    };
    let mut saga = SagaConsumer::new(consumer, &participant, &pool);
    saga.inbox_retention = Duration::from_secs(86_400);
    saga.purge_every = Duration::from_secs(1);
    let mut tasks = Supervisor::new(CancellationToken::new());
    saga.spawn_batches(&mut tasks, pool.clone(), |pool: PgPool, items| async move {
        let (mut tx, fresh) = begin(&pool, "saga-kit-test", &items).await?;
        for i in fresh.indices() {
            effect(&mut tx, &items[i].message, i)
                .await
                .map_err(kafka::consumer::HandleError::transient)?;
        }
        commit(tx, &fresh).await
    });
    // Not ready until the broker answered and the consumer made sure of
    // the saga's topics.
    let end = Instant::now() + Duration::from_secs(60);
    while let Some(what) = tasks.health().waiting_for() {
        assert!(Instant::now() < end, "still waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for topic in contract::topics::ALL {
        let config = kafka::topic_config(&brokers, topic).await;
        assert!(config.is_ok(), "{topic}: {config:?}");
    }
    let producer = kafka::producer(&brokers).unwrap();
    let order = Uuid::new_v4();
    let (a, b) = (reserve(order), reserve(order));
    for envelope in [&a, &b, &a] {
        // Stamped as the relay stamps order-api's commands.
        let headers = kafka::stamp(
            kafka::headers(&envelope.event_id.to_string(), &envelope.event_type, None),
            contract::producers::ORDER_API,
        );
        let key = order.to_string();
        kafka::publish(&producer, consumer.topic, &key, &envelope.to_bytes(), headers)
            .await
            .unwrap();
    }
    wait_for(&pool, "effects", 2).await;
    // The old row purged by the retention task beside the consumer; the two
    // events applied recorded with the copy the log holds.
    wait_for(&pool, "inbox", 2).await;
    let sourced: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox WHERE source_offset IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sourced, 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&pool, "effects").await, 2, "the third copy was absorbed");
    tasks.token().cancel();
    tasks.wait().await.unwrap();
    pool.close().await;
}
