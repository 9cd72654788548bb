//! Relay throughput and latency, against a real PostgreSQL and Apache Kafka.
//!
//! `cargo bench -p effectively-once-outbox --bench relay`
//!
//! 1. raw: rdkafka's idempotent producer sending n envelopes straight to the broker;
//! 2. relay: the same n envelopes as outbox rows, claimed, published and marked;
//! 3. relay, database side only: the publisher accepts instantly (no broker);
//! 4. idle-to-published latency of single rows with the relay idle (probing every 5 ms).

use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use outbox::relay::{PendingRow, PublishError, Publisher};
use outbox::{KafkaPublisher, Relay};
use rdkafka::producer::FutureProducer;
use sqlx::PgPool;
use testkit::{Broker, TempDb};
use uuid::Uuid;

/// Rows per round, rounds, and the relay's batch size and batches in flight
/// (outbox-relay's defaults, `RELAY_BATCH` and `RELAY_IN_FLIGHT`); override
/// with `BENCH_ROWS`, `BENCH_ROUNDS`, `BENCH_BATCH`, `BENCH_IN_FLIGHT`.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

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

/// A fresh outbox database, dropped with the returned guard.
async fn fresh_db(tag: &str) -> (PgPool, TempDb) {
    let (db, pool) = TempDb::with_pool(&format!("eo_bench_{tag}"), 8, vec![outbox::migrator()])
        .await
        .unwrap();
    (pool, db)
}

async fn fill(pool: &PgPool, topic: &str, n: usize) {
    for chunk in 0..n.div_ceil(1_000) {
        let mut tx = pool.begin().await.unwrap();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
            outbox::enqueue(&mut tx, &outbox_event(topic, &envelope(i)))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// Runs `relay` (the production pipeline) until it has published `n` rows; the rate.
async fn relay_rate<P: Publisher>(relay: Relay<P>, source: &str, n: usize) -> f64 {
    let token = tokio_util::sync::CancellationToken::new();
    let labels = [("source", source)];
    let start = Instant::now();
    let watch = async {
        while (telemetry::metrics::get("relay_published_total", &labels) as usize) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let elapsed = start.elapsed();
        token.cancel();
        elapsed
    };
    let ((), elapsed) = tokio::join!(relay.run(token.clone()), watch);
    assert_eq!(telemetry::metrics::get("relay_publish_errors_total", &labels), 0.0);
    n as f64 / elapsed.as_secs_f64()
}

/// CPU seconds used so far by this process, the broker and PostgreSQL (all
/// its processes), from /proc: where a phase's CPU went on a shared machine.
fn cpu() -> [f64; 3] {
    let by_command = testkit::process::cpu_seconds_by_command();
    [
        testkit::process::cpu_seconds_of(std::process::id()),
        by_command.get("java").copied().unwrap_or(0.0),
        by_command.get("postgres").copied().unwrap_or(0.0),
    ]
}

/// CPU milliseconds per 1,000 messages of a phase, per party.
fn cpu_per_1k(before: [f64; 3], after: [f64; 3], n: usize) -> [f64; 3] {
    std::array::from_fn(|i| (after[i] - before[i]) * 1e6 / n as f64)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    // The relay records through the `metrics` facade: a recorder to count in.
    telemetry::metrics::install();
    let (n, batch, in_flight, rounds) = (
        knob("BENCH_ROWS", 20_000),
        knob("BENCH_BATCH", 1024) as i64,
        knob("BENCH_IN_FLIGHT", 2),
        knob("BENCH_ROUNDS", 5),
    );
    let broker = Broker::start().await.unwrap();

    // 1 and 2, alternating `rounds` times on fresh topics and databases (the
    //    broker's speed drifts as its log grows). The relay runs as
    //    outbox-relay runs it: `in_flight` batches of `batch` rows awaiting the
    //    broker. The raw producer it is held against sends the same messages
    //    with the same number in flight (`in_flight` streams, each sending a
    //    window of `batch` and awaiting its acks). For context, the ceiling:
    //    the raw producer handing all n messages to rdkafka at once.
    let mut base = rdkafka::ClientConfig::new();
    base.set("bootstrap.servers", &broker.addr);
    let producer = outbox::kafka::idempotent_producer(base, Duration::from_secs(15)).unwrap();
    let publisher = KafkaPublisher::new(&broker.addr).unwrap();
    let (mut ceilings, mut raws, mut relays) = (Vec::new(), Vec::new(), Vec::new());
    let (mut raw_cpu, mut relay_cpu) = (Vec::new(), Vec::new());
    let mut keep = Vec::new();
    for round in 0..rounds {
        let topic = format!("bench.relay.{round}");
        testkit::topics::create(&broker.addr, &[topic.as_str()], 3)
            .await
            .unwrap();
        let envelopes: Vec<Envelope> = (0..n).map(envelope).collect();
        let start = Instant::now();
        let sends = envelopes.iter().map(|e| publish(&producer, &topic, e));
        for r in futures::future::join_all(sends).await {
            r.unwrap();
        }
        ceilings.push(n as f64 / start.elapsed().as_secs_f64());

        let (before, start) = (cpu(), Instant::now());
        let streams = envelopes.chunks(n.div_ceil(in_flight)).map(|stream| {
            let (producer, topic) = (&producer, topic.as_str());
            async move {
                for window in stream.chunks(batch as usize) {
                    let sends = window.iter().map(|e| publish(producer, topic, e));
                    for r in futures::future::join_all(sends).await {
                        r.unwrap();
                    }
                }
            }
        });
        futures::future::join_all(streams).await;
        raws.push(n as f64 / start.elapsed().as_secs_f64());
        raw_cpu.push(cpu_per_1k(before, cpu(), n));

        let (pool, db) = fresh_db("relay").await;
        fill(&pool, &topic, n).await;
        let source = format!("bench-{round}");
        let relay = Relay::new(pool.clone(), publisher.clone(), &source)
            .batch(batch)
            .in_flight(in_flight);
        let before = cpu();
        relays.push(relay_rate(relay, &source, n).await);
        relay_cpu.push(cpu_per_1k(before, cpu(), n));
        println!(
            "round {round}: ceiling {:>6.0} msg/s, raw {:>6.0} msg/s, relay {:>6.0} rows/s ({:.0} % of raw, {:.0} % of ceiling)",
            ceilings[round],
            raws[round],
            relays[round],
            relays[round] / raws[round] * 100.0,
            relays[round] / ceilings[round] * 100.0
        );
        keep.push((pool, db));
    }
    let (ceiling, raw, relayed) = (median(&ceilings), median(&raws), median(&relays));
    let cpu_median =
        |v: &[[f64; 3]]| -> [f64; 3] { std::array::from_fn(|i| median(&v.iter().map(|c| c[i]).collect::<Vec<_>>())) };
    let (raw_cpu, relay_cpu) = (cpu_median(&raw_cpu), cpu_median(&relay_cpu));
    println!("raw producer, ceiling   {ceiling:>9.0} msg/s  (median of {rounds}; {n} messages, all in flight)");
    println!(
        "raw producer            {raw:>9.0} msg/s  (median of {rounds}; {in_flight} streams of windows of {batch})"
    );
    println!(
        "relay → broker          {relayed:>9.0} rows/s (median of {rounds}; {:.0} % of raw, goal ≥ 80 %; {:.0} % of the ceiling; batches of {batch}, {in_flight} in flight)",
        relayed / raw * 100.0,
        relayed / ceiling * 100.0
    );
    println!(
        "CPU ms per 1,000 msgs   raw: client {:.0}, broker {:.0} (total {:.0}); relay: client {:.0}, broker {:.0}, PostgreSQL {:.0} (total {:.0})",
        raw_cpu[0], raw_cpu[1], raw_cpu[0] + raw_cpu[1], relay_cpu[0], relay_cpu[1], relay_cpu[2], relay_cpu.iter().sum::<f64>()
    );
    let (pool, db) = keep.pop().unwrap();
    let topic = "bench.relay.0";

    // 3. Database side only: the same pipeline, the publisher acks at once.
    let (pool2, db2) = fresh_db("relaydb").await;
    fill(&pool2, topic, n).await;
    let relay_db = Relay::new(pool2.clone(), NullPublisher, "bench-db")
        .batch(batch)
        .in_flight(in_flight);
    let db_side = relay_rate(relay_db, "bench-db", n).await;
    println!("relay, database side    {db_side:>9.0} rows/s (claim + mark; goal ≥ 20,000)");

    // 4. Idle-to-published latency with the real broker.
    let token = tokio_util::sync::CancellationToken::new();
    let idle = Relay::new(pool.clone(), KafkaPublisher::new(&broker.addr).unwrap(), "bench-idle")
        .poll_interval(Duration::from_millis(5));
    let runner = tokio::spawn({
        let token = token.clone();
        async move { idle.run(token).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut lat = Vec::new();
    for i in 0..200 {
        let env = envelope(i);
        let mut tx = pool.begin().await.unwrap();
        outbox::enqueue(&mut tx, &outbox_event(topic, &env)).await.unwrap();
        tx.commit().await.unwrap();
        let ms: f64 = loop {
            let v: Option<f64> = sqlx::query_scalar(
                "SELECT EXTRACT(EPOCH FROM published_at - created_at)::float8 * 1000 FROM outbox_published WHERE event_id = $1",
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
        "bench": "relay", "rows": n, "batch": batch, "in_flight": in_flight, "rounds": rounds,
        "ceiling_rounds_msgs_per_s": ceilings, "raw_rounds_msgs_per_s": raws, "relay_rounds_rows_per_s": relays,
        "ceiling_msgs_per_s": ceiling,
        "raw_cpu_ms_per_1k": {"client": raw_cpu[0], "broker": raw_cpu[1]},
        "relay_cpu_ms_per_1k": {"client": relay_cpu[0], "broker": relay_cpu[1], "postgres": relay_cpu[2]}, "relay_vs_ceiling_percent": relayed / ceiling * 100.0,
        "raw_msgs_per_s": raw, "relay_rows_per_s": relayed, "relay_vs_raw_percent": relayed / raw * 100.0,
        "db_side_rows_per_s": db_side, "idle_latency_p50_ms": p50, "idle_latency_p99_ms": p99,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results");
    std::fs::create_dir_all(&dir).ok();
    std::fs::write(dir.join("relay.json"), serde_json::to_vec_pretty(&json).unwrap()).ok();
    keep.push((pool, db));
    keep.push((pool2, db2));
    for (p, _db) in keep {
        p.close().await;
    }
}

/// The outbox row of `envelope` on `topic`, as `saga_kit::emit` writes it
/// (the outbox crate cannot depend on the saga's glue, which depends on it).
fn outbox_event<'a>(topic: &'a str, envelope: &'a Envelope) -> outbox::OutboxEvent<'a> {
    outbox::OutboxEvent::json(
        topic,
        envelope.order_id,
        envelope.event_id,
        &envelope.event_type,
        envelope,
    )
    .traceparent(envelope.traceparent.as_deref())
}

/// Puts `envelope` on `topic` as the relay publishes an outbox row: keyed by
/// its order id, identity and trace context as headers.
async fn publish(producer: &FutureProducer, topic: &str, envelope: &Envelope) -> rdkafka::error::KafkaResult<()> {
    let headers = outbox::kafka::headers(
        &envelope.event_id.to_string(),
        &envelope.event_type,
        envelope.traceparent.as_deref(),
    );
    outbox::kafka::publish(
        producer,
        topic,
        &envelope.order_id.to_string(),
        &envelope.to_bytes(),
        headers,
    )
    .await
}
