//! The consumer that needs no inbox (`saga_kit::projection`, issue 59):
//! its write is idempotent and commutative by the order's key, so
//! redelivered copies, a batch handled twice, a replay in another order
//! and a replay of the whole topic through the consume loop leave the read
//! model as it was. Beside it, the same redelivery doubles a counter: the
//! write that does need an inbox. Removal tried: `last_event_at` taken from
//! the arriving copy (`= EXCLUDED.last_event_at`, last by arrival, not
//! `GREATEST`) — the replay in reverse order then changed the table and
//! this failed.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, Handled, Traced};
use kafka::KafkaArgs;
use sqlx::PgPool;
use testkit::TempDb;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const COUNTER: &str = "CREATE TABLE reply_counts (order_id uuid PRIMARY KEY, replies integer NOT NULL)";

async fn world() -> (TempDb, PgPool) {
    TempDb::with_tables(
        "eo_projection",
        vec![],
        &format!("{}; {COUNTER}", saga_kit::projection::SCHEMA),
    )
    .await
    .unwrap()
}

/// The replies of three orders: one confirmed, one rejected, one refunded.
fn replies() -> Vec<Envelope> {
    let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let captured = Message::PaymentCaptured { charge_id: "ch".into() };
    let mut out = Vec::new();
    for (order, messages) in [
        (a, vec![Message::StockReserved, captured.clone()]),
        (
            b,
            vec![Message::StockRejected {
                reason: "out of stock".into(),
            }],
        ),
        (
            c,
            vec![
                Message::StockReserved,
                captured,
                Message::PaymentRefunded { refund_id: "re".into() },
                Message::StockReleased,
            ],
        ),
    ] {
        for (i, m) in messages.iter().enumerate() {
            let mut e = Envelope::new(order, m, None);
            e.occurred_at = DateTime::<Utc>::from_timestamp(1_800_000_000 + i as i64, 0).unwrap();
            out.push(e);
        }
    }
    out
}

type Row = (Uuid, bool, bool, bool, bool, bool, bool, DateTime<Utc>);

async fn table(pool: &PgPool) -> Vec<Row> {
    sqlx::query_as(
        "SELECT order_id, reserved, rejected, released, paid, declined, refunded, last_event_at
         FROM order_progress ORDER BY order_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn apply(pool: &PgPool, batch: &[Envelope]) {
    saga_kit::projection::apply(&mut pool.acquire().await.unwrap(), batch)
        .await
        .unwrap();
}

/// A counter of replies per order: `n = n + 1`, the write an inbox exists for.
async fn count(pool: &PgPool, batch: &[Envelope]) {
    for e in batch {
        sqlx::query(
            "INSERT INTO reply_counts VALUES ($1, 1)
             ON CONFLICT (order_id) DO UPDATE SET replies = reply_counts.replies + 1",
        )
        .bind(e.order_id)
        .execute(pool)
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn redeliveries_replays_and_reorderings_leave_the_read_model_as_it_was() {
    let (_db, pool) = world().await;
    let all = replies();
    let (first, second) = all.split_at(3);
    apply(&pool, first).await;
    apply(&pool, second).await;
    count(&pool, &all).await;
    let once = table(&pool).await;
    assert_eq!(once.len(), 3);
    let c = once
        .iter()
        .find(|r| r.4 && r.6)
        .expect("the refunded order: paid, refunded");
    assert!(c.1 && c.3, "reserved and released: {c:?}");

    // The second batch redelivered; one copy twice inside a batch.
    apply(&pool, second).await;
    apply(&pool, &[all[0].clone(), all[0].clone()]).await;
    // The whole topic replayed in reverse order, one message a batch.
    for e in all.iter().rev() {
        apply(&pool, std::slice::from_ref(e)).await;
    }
    assert_eq!(table(&pool).await, once, "the read model did not move");

    // The same redeliveries double the counter.
    count(&pool, second).await;
    let counted: i64 = sqlx::query_scalar("SELECT sum(replies)::int8 FROM reply_counts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        counted,
        (all.len() + second.len()) as i64,
        "a counter counts every copy"
    );
}

/// Through the consume loop: the topic applied by one consumer group, then
/// all of it again by another (every message redelivered) into the same
/// table, in batches of up to 32.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_topic_delivered_twice_through_the_consumer_is_applied_once() {
    let (_db, pool) = world().await;
    let broker = testkit::broker::shared().await.unwrap();
    let topic = format!("projection-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    let producer = kafka::producer(&broker).unwrap();
    let all: Vec<Envelope> = (0..20).flat_map(|_| replies()).collect();
    for e in &all {
        let headers = kafka::headers(&e.event_id.to_string(), &e.event_type, None);
        kafka::publish(&producer, &topic, &e.order_id.to_string(), &e.to_bytes(), headers)
            .await
            .unwrap();
    }
    let mut tables = Vec::new();
    for group in ["first", "replay"] {
        let token = CancellationToken::new();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (p, s) = (pool.clone(), seen.clone());
        let settings = ConsumerSettings {
            kafka: KafkaArgs::new(broker.clone()),
            group_id: format!("{group}.{topic}"),
            topics: vec![topic.clone()],
            max_batch: 32,
        };
        let run = tokio::spawn(kafka::consumer::run_batches(
            settings,
            token.clone(),
            move |batch: Vec<Traced<Envelope>>| {
                let (pool, seen) = (p.clone(), s.clone());
                async move {
                    let envelopes: Vec<Envelope> = batch.into_iter().map(|t| t.message).collect();
                    let mut conn = pool.acquire().await.map_err(saga_kit::consumer::classify)?;
                    saga_kit::projection::apply(&mut conn, &envelopes)
                        .await
                        .map_err(saga_kit::consumer::classify)?;
                    seen.fetch_add(envelopes.len(), std::sync::atomic::Ordering::SeqCst);
                    Ok(vec![Handled::Applied; envelopes.len()])
                }
            },
        ));
        let end = Instant::now() + Duration::from_secs(60);
        while seen.load(std::sync::atomic::Ordering::SeqCst) < all.len() {
            assert!(Instant::now() < end, "{group}: only {seen:?} of {} applied", all.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        token.cancel();
        run.await.unwrap().unwrap();
        tables.push(table(&pool).await);
    }
    assert_eq!(tables[0].len(), 60, "twenty times three orders");
    assert_eq!(tables[1], tables[0], "the replay changed nothing");
}
