//! Relay throughput and latency, against a real PostgreSQL and tansu.
//!
//! `cargo bench -p outbox --bench relay`
//!
//! 1. raw: rdkafka's idempotent producer sending N envelopes straight to the broker;
//! 2. relay: the same N envelopes as outbox rows, claimed, published and marked;
//! 3. relay, database side only: the publisher accepts instantly (no broker);
//! 4. idle-to-published latency of single rows with the relay idle on LISTEN.

use std::time::{Duration, Instant};

use e2e::broker::Broker;
use messaging::{Envelope, Message};
use outbox::relay::{PendingRow, PublishError, Publisher};
use outbox::{KafkaPublisher, Relay};
use sqlx::PgPool;
use uuid::Uuid;

const N: usize = 10_000;
const BATCH: i64 = 1_000;
const WORKERS: usize = 3;

struct NullPublisher;

impl Publisher for NullPublisher {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        rows.iter().map(|_| Ok(())).collect()
    }
}

fn envelope(i: usize) -> Envelope {
    Envelope::new(
        Uuid::new_v4(),
        &Message::ReserveStock {
            sku: format!("SKU-{}", i % 50),
            quantity: 1 + (i % 3) as i32,
        },
        None,
    )
}

async fn fresh_db(tag: &str) -> (PgPool, String) {
    let base = runtime::db::server_url();
    let url = format!("{base}/eo_bench_{tag}_{}", Uuid::new_v4().simple());
    (
        runtime::db::connect(&url, 8, vec![outbox::migrator()]).await.unwrap(),
        url,
    )
}

async fn fill(pool: &PgPool, topic: &str, n: usize) {
    for chunk in 0..n.div_ceil(1_000) {
        let mut tx = pool.begin().await.unwrap();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
            outbox::enqueue(&mut tx, topic, &envelope(i)).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
}

async fn drain<P: Publisher>(relay: &Relay<P>) -> usize {
    let mut total = 0;
    let mut idle_rounds = 0;
    loop {
        let r = relay.run_once().await.unwrap();
        assert_eq!(r.failed + r.parked, 0);
        total += r.published;
        // Another loop may hold the last rows: stop after a few empty rounds.
        idle_rounds = if r.claimed == 0 { idle_rounds + 1 } else { 0 };
        if idle_rounds == 3 {
            return total;
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let broker = Broker::start().await.unwrap();

    // 1 and 2, alternating three times on fresh topics and databases (the
    //    broker's speed drifts as its log grows): the raw producer with the
    //    relay's concurrency (WORKERS streams of BATCH-sized windows, each
    //    awaiting its acks), then the relay with WORKERS claim loops sharing
    //    one producer, as outbox-relay runs them.
    let producer = messaging::kafka::producer(&broker.addr).unwrap();
    let publisher = KafkaPublisher::new(&broker.addr).unwrap();
    let (mut raws, mut relays_rate) = (Vec::new(), Vec::new());
    let mut keep = Vec::new();
    for round in 0..3 {
        let topic = format!("bench.relay.{round}");
        messaging::kafka::ensure_topics(&broker.addr, &[topic.as_str()])
            .await
            .unwrap();
        let envelopes: Vec<Envelope> = (0..N).map(envelope).collect();
        let start = Instant::now();
        let streams = envelopes.chunks(N.div_ceil(WORKERS)).map(|stream| {
            let (producer, topic) = (&producer, topic.as_str());
            async move {
                for window in stream.chunks(BATCH as usize) {
                    let sends = window.iter().map(|e| messaging::kafka::publish(producer, topic, e));
                    for r in futures::future::join_all(sends).await {
                        r.unwrap();
                    }
                }
            }
        });
        futures::future::join_all(streams).await;
        raws.push(N as f64 / start.elapsed().as_secs_f64());

        let (pool, url) = fresh_db("relay").await;
        fill(&pool, &topic, N).await;
        let relays: Vec<_> = (0..WORKERS)
            .map(|_| Relay::new(pool.clone(), publisher.clone(), "bench").batch(BATCH))
            .collect();
        let start = Instant::now();
        let published: usize = futures::future::join_all(relays.iter().map(drain))
            .await
            .into_iter()
            .sum();
        assert_eq!(published, N);
        relays_rate.push(N as f64 / start.elapsed().as_secs_f64());
        println!(
            "round {round}: raw {:>7.0} msg/s, relay {:>7.0} rows/s",
            raws[round], relays_rate[round]
        );
        keep.push((pool, url));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (raw, relayed) = (median(&mut raws), median(&mut relays_rate));
    println!("raw producer            {raw:>9.0} msg/s  (median of 3; {N} messages, {WORKERS} streams of windows of {BATCH})");
    println!("relay → broker          {relayed:>9.0} rows/s (median of 3; {:.0} % of raw; goal ≥ 80 %; {WORKERS} claim loops)", relayed / raw * 100.0);
    let (pool, url) = keep.pop().unwrap();
    let topic = "bench.relay.0";

    // 3. Database side only.
    let (pool2, url2) = fresh_db("relaydb").await;
    fill(&pool2, topic, N).await;
    let relay_db = Relay::new(pool2.clone(), NullPublisher, "bench").batch(BATCH);
    let start = Instant::now();
    assert_eq!(drain(&relay_db).await, N); // one loop: the database side alone
    let db_side = N as f64 / start.elapsed().as_secs_f64();
    println!("relay, database side    {db_side:>9.0} rows/s (claim + mark; goal ≥ 20,000)");

    // 4. Idle-to-published latency with the real broker.
    let token = tokio_util::sync::CancellationToken::new();
    let idle = Relay::new(pool.clone(), KafkaPublisher::new(&broker.addr).unwrap(), "bench-idle")
        .poll_interval(Duration::from_secs(5));
    let runner = tokio::spawn({
        let token = token.clone();
        async move { idle.run(token).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut lat = Vec::new();
    for i in 0..200 {
        let env = envelope(i);
        let mut tx = pool.begin().await.unwrap();
        outbox::enqueue(&mut tx, topic, &env).await.unwrap();
        tx.commit().await.unwrap();
        let ms: f64 = loop {
            let v: Option<f64> = sqlx::query_scalar(
                "SELECT EXTRACT(EPOCH FROM published_at - created_at)::float8 * 1000 FROM outbox WHERE event_id = $1 AND published_at IS NOT NULL",
            )
            .bind(env.event_id)
            .fetch_optional(&pool)
            .await
            .unwrap();
            if let Some(v) = v {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        lat.push(ms);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token.cancel();
    runner.await.unwrap();
    lat.sort_by(f64::total_cmp);
    let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
    println!("idle → published        p50 {p50:.2} ms  p99 {p99:.2} ms (200 single rows; goal p99 ≤ 20 ms)");

    let json = serde_json::json!({
        "bench": "relay", "rows": N, "batch": BATCH,
        "raw_msgs_per_s": raw, "relay_rows_per_s": relayed, "relay_vs_raw_percent": relayed / raw * 100.0,
        "db_side_rows_per_s": db_side, "idle_latency_p50_ms": p50, "idle_latency_p99_ms": p99,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results");
    std::fs::create_dir_all(&dir).ok();
    std::fs::write(dir.join("relay.json"), serde_json::to_vec_pretty(&json).unwrap()).ok();
    keep.push((pool, url));
    keep.push((pool2, url2));
    for (p, u) in keep {
        p.close().await;
        runtime::db::drop_database(&u).await.unwrap();
    }
}
