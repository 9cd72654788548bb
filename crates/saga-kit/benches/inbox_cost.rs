//! What an inbox costs a consumer that does not need one: the order-progress
//! read model (`saga_kit::projection`) applied with and without inbox rows,
//! per message, on the same broker, the same topic and the same batches.
//!
//! `cargo bench -p saga-kit --bench inbox_cost`
//!
//! `MESSAGES` replies are published once to a topic of their own; then each
//! way reads the whole topic with a consumer group of its own (batches of
//! up to 32), three times, alternating, the tables emptied before each run:
//!
//! - **alone**: one statement per batch — the projection's upsert, in its
//!   own implicit transaction;
//! - **with the inbox**: what every consumer of the saga does, by its own
//!   functions — `saga_kit::consumer::begin` (`BEGIN`, the batch's inbox
//!   rows with their sources and fingerprints), the upsert of the new
//!   ones, `saga_kit::consumer::commit`.
//!
//! Per message: wall time, CPU of this process (the consumer and its
//! driver) and of PostgreSQL (every `postgres` process: run it alone),
//! WAL written, and the rows the inbox leaves behind. Results go to stdout
//! and `target/bench-results/inbox-cost.json`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use kafka::consumer::{ConsumerSettings, HandleError, Handled, Traced};
use kafka::KafkaArgs;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const MESSAGES: usize = 20_000;
const ROUNDS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
enum Way {
    Alone,
    WithInbox,
}

#[derive(Debug, serde::Serialize)]
struct Run {
    way: Way,
    round: usize,
    messages: usize,
    batches: usize,
    secs: f64,
    messages_per_sec: f64,
    us_wall_per_message: f64,
    us_cpu_consumer_per_message: f64,
    us_cpu_postgres_per_message: f64,
    wal_bytes_per_message: f64,
    inbox_rows_after: i64,
    /// Sequential scans of the inbox during the run (the read of a batch's
    /// earlier rows should be index scans).
    inbox_seq_scans: i64,
}

async fn inbox_seq_scans(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COALESCE(seq_scan, 0)::int8 FROM pg_stat_user_tables WHERE relname = 'inbox'")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wal_lsn(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn cpu(name: &str) -> f64 {
    testkit::process::cpu_seconds_by_command()
        .get(name)
        .copied()
        .unwrap_or(0.0)
}

/// A reply of the saga for one of 2,000 orders.
fn reply(i: usize, orders: &[Uuid]) -> Envelope {
    let message = match i % 4 {
        0 => Message::StockReserved,
        1 => Message::PaymentCaptured { charge_id: "ch".into() },
        2 => Message::StockReleased,
        _ => Message::PaymentRefunded { refund_id: "re".into() },
    };
    Envelope::new(orders[i % orders.len()], &message, None)
}

async fn handle(pool: PgPool, way: Way, batch: Vec<Traced<Envelope>>) -> Result<Vec<Handled>, HandleError> {
    let classify = saga_kit::consumer::classify;
    match way {
        Way::Alone => {
            let envelopes: Vec<Envelope> = batch.into_iter().map(|t| t.message).collect();
            let mut conn = pool.acquire().await.map_err(classify)?;
            saga_kit::projection::apply(&mut conn, &envelopes)
                .await
                .map_err(classify)?;
            Ok(vec![Handled::Applied; envelopes.len()])
        }
        // The saga consumers' own path: `begin` (the inbox rows), the
        // effect of the new ones, `commit`.
        Way::WithInbox => {
            let (mut tx, fresh) = saga_kit::consumer::begin(&pool, "inbox-cost", &batch).await?;
            let new: Vec<Envelope> = fresh.indices().into_iter().map(|i| batch[i].message.clone()).collect();
            saga_kit::projection::apply(&mut tx, &new).await.map_err(classify)?;
            saga_kit::consumer::commit(tx, &fresh).await
        }
    }
}

async fn run(pool: &PgPool, broker: &str, topic: &str, way: Way, round: usize) -> Run {
    sqlx::raw_sql("TRUNCATE order_progress, inbox")
        .execute(pool)
        .await
        .unwrap();
    let scans = inbox_seq_scans(pool).await;
    let token = CancellationToken::new();
    let (seen, batches) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let settings = ConsumerSettings {
        kafka: KafkaArgs::new(broker),
        group_id: format!("inbox-cost-{way:?}-{round}-{}", Uuid::new_v4().simple()),
        topics: vec![topic.to_owned()],
        max_batch: 32,
    };
    let (p, s, b) = (pool.clone(), seen.clone(), batches.clone());
    let consumer = tokio::spawn(kafka::consumer::run_batches(
        settings,
        token.clone(),
        move |batch: Vec<Traced<Envelope>>| {
            let (pool, seen, batches) = (p.clone(), s.clone(), b.clone());
            async move {
                let n = batch.len();
                let handled = handle(pool, way, batch).await?;
                seen.fetch_add(n, Ordering::SeqCst);
                batches.fetch_add(1, Ordering::SeqCst);
                Ok(handled)
            }
        },
    ));
    // Timed from the first message handled: the group's join is not the inbox's.
    while seen.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (started, wal, me, pg) = (
        Instant::now(),
        wal_lsn(pool).await,
        testkit::process::cpu_seconds_of(std::process::id()),
        cpu("postgres"),
    );
    let from = seen.load(Ordering::SeqCst);
    while seen.load(Ordering::SeqCst) < MESSAGES {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = (MESSAGES - from) as f64;
    let (me, pg, wal) = (
        testkit::process::cpu_seconds_of(std::process::id()) - me,
        cpu("postgres") - pg,
        (wal_lsn(pool).await - wal) as f64,
    );
    token.cancel();
    consumer.await.unwrap().unwrap();
    let inbox_rows_after = sqlx::query_scalar("SELECT count(*) FROM inbox")
        .fetch_one(pool)
        .await
        .unwrap();
    // Statistics reach the view within a moment of the transactions.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let inbox_seq_scans = inbox_seq_scans(pool).await - scans;
    Run {
        inbox_seq_scans,
        way,
        round,
        messages: MESSAGES,
        batches: batches.load(Ordering::SeqCst),
        secs,
        messages_per_sec: n / secs,
        us_wall_per_message: 1e6 * secs / n,
        us_cpu_consumer_per_message: 1e6 * me / n,
        us_cpu_postgres_per_message: 1e6 * pg / n,
        wal_bytes_per_message: wal / n,
        inbox_rows_after,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let broker = testkit::broker::shared().await.unwrap();
    let (_db, pool) =
        testkit::TempDb::with_tables("eo_inbox_cost", vec![inbox::migrator()], saga_kit::projection::SCHEMA)
            .await
            .unwrap();
    let topic = format!("inbox-cost-{}", Uuid::new_v4().simple());
    kafka::ensure_topics(&broker, &[&topic]).await.unwrap();
    let producer = kafka::producer(&broker).unwrap();
    let orders: Vec<Uuid> = (0..2_000).map(|_| Uuid::new_v4()).collect();
    for i in 0..MESSAGES {
        let e = reply(i, &orders);
        let headers = kafka::headers(&e.event_id.to_string(), &e.event_type, None);
        kafka::publish(&producer, &topic, &e.order_id.to_string(), &e.to_bytes(), headers)
            .await
            .unwrap();
    }
    let mut runs = Vec::new();
    for round in 0..ROUNDS {
        for way in [Way::Alone, Way::WithInbox] {
            let r = run(&pool, &broker, &topic, way, round).await;
            println!(
                "{:?} round {round}: {:.0} msg/s, {:.1} µs wall, {:.1} µs consumer CPU, {:.1} µs PostgreSQL CPU, {:.0} B WAL per message; {} batches; inbox rows after: {}, its sequential scans: {}",
                r.way,
                r.messages_per_sec,
                r.us_wall_per_message,
                r.us_cpu_consumer_per_message,
                r.us_cpu_postgres_per_message,
                r.wal_bytes_per_message,
                r.batches,
                r.inbox_rows_after,
                r.inbox_seq_scans
            );
            runs.push(r);
        }
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results");
    std::fs::create_dir_all(&dir).unwrap();
    let report = serde_json::json!({
        "date": chrono::Utc::now().to_rfc3339(),
        "messages": MESSAGES,
        "max_batch": 32,
        "runs": runs,
    });
    std::fs::write(dir.join("inbox-cost.json"), serde_json::to_vec_pretty(&report).unwrap()).unwrap();
}
