//! The ceilings the saga's figures are held against, measured on the same
//! machine and the same stack: what the broker and the database can do
//! alone, in tight loops, with the project's own client settings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use rdkafka::consumer::Consumer;
use rdkafka::Message as _;
use serde::Serialize;
use uuid::Uuid;

/// Kafka messages one CONFIRMED order needs: ReserveStock, StockReserved,
/// ChargePayment, PaymentCaptured.
pub const MESSAGES_PER_ORDER: f64 = 4.0;
/// Database transactions of one CONFIRMED order besides its creation:
/// inventory's reserve, the saga's two steps, payment's PENDING record and
/// its settlement (relay claims and marks come in batches and are left out).
pub const CONSUMER_TRANSACTIONS_PER_ORDER: f64 = 5.0;

/// The broker alone.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerCeiling {
    /// Messages produced and consumed.
    pub messages: usize,
    /// Bytes per message (a real ReserveStock envelope).
    pub message_bytes: usize,
    /// Messages per second through the broker (produced and consumed, concurrently).
    pub messages_per_sec: f64,
    /// The same as orders per second ([`MESSAGES_PER_ORDER`] messages each).
    pub orders_per_sec: f64,
    /// CPU of every process (the broker's JVM, the driver's producer and
    /// consumer) per message produced and consumed, ms.
    pub cpu_ms_per_message: f64,
}

/// PostgreSQL alone.
#[derive(Debug, Clone, Serialize)]
pub struct DatabaseCeiling {
    /// Concurrent clients of each loop.
    pub clients: usize,
    /// order-api's create transaction (idempotency key + order + history + outbox row) per second.
    pub create_tx_per_sec: f64,
    /// inventory's consumer transaction (inbox + reservation + stock +
    /// outbox row) per second, one command per transaction.
    pub consumer_tx_per_sec: f64,
    /// Commands per second through the same handler in batches of
    /// [`CONSUMER_BATCH`], the services' largest batch (one transaction each).
    pub consumer_batched_per_sec: f64,
    /// Orders per second if the database were the only limit: one create
    /// and [`CONSUMER_TRANSACTIONS_PER_ORDER`] consumer commands each, at
    /// the batched rate (under load every consumer's batches are full).
    pub orders_per_sec: f64,
    /// CPU of every process (PostgreSQL and the driver) per create
    /// transaction, ms.
    pub create_cpu_ms: f64,
    /// A bare commit — one order-sized row inserted in its own transaction —
    /// per second, the same clients.
    pub bare_commit_per_sec: f64,
    /// CPU of every process per bare commit, ms.
    pub bare_commit_cpu_ms: f64,
    /// … per batched consumer command, ms.
    pub consumer_batched_cpu_ms: f64,
}

/// The services' largest consumer batch (`KAFKA_CONSUMER_MAX_BATCH`'s default).
pub const CONSUMER_BATCH: usize = 32;

fn sample_envelope() -> Envelope {
    let message = Message::ReserveStock {
        sku: "WIDGET".into(),
        quantity: 2,
    };
    Envelope::new(Uuid::now_v7(), &message, None)
}

/// Produces `n` envelope-sized messages to a fresh topic while a consumer
/// with the services' settings reads them, so the consumer stays near the
/// log's end as the services' do. Timed until the consumer has all `n`.
pub async fn broker(brokers: &kafka::KafkaArgs, n: usize) -> anyhow::Result<BrokerCeiling> {
    let topic = format!("bench.ceiling.{}", Uuid::new_v4().simple());
    brokers.ensure_topics(&[&topic]).await?;
    let body = sample_envelope().to_bytes();
    let settings = kafka::consumer::ConsumerSettings {
        kafka: brokers.clone(),
        group_id: format!("bench-{topic}"),
        topics: vec![topic.clone()],
        max_batch: 1,
    };
    let consumer = kafka::consumer::build(&settings)?;
    let producer = kafka::producer(brokers)?;
    let cpu = Cpu::start();
    let started = Instant::now();
    let produce = async {
        for window in (0..n).collect::<Vec<_>>().chunks(500) {
            let sends = window.iter().map(|i| {
                let key = format!("order-{i}");
                let body = body.clone();
                let producer = &producer;
                let topic = &topic;
                async move {
                    let headers = kafka::headers(&i.to_string(), "ReserveStock", None);
                    kafka::publish(producer, topic, &key, &body, headers).await
                }
            });
            for r in futures::future::join_all(sends).await {
                r?;
            }
        }
        anyhow::Ok(())
    };
    let consume = async {
        let mut got = 0;
        while got < n {
            let msg = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
                .await
                .map_err(|_| anyhow::anyhow!("consumer stalled after {got} of {n} messages"))??;
            consumer.store_offset(msg.topic(), msg.partition(), msg.offset())?;
            got += 1;
        }
        anyhow::Ok(())
    };
    let (p, c) = tokio::join!(produce, consume);
    p?;
    c?;
    let per_sec = n as f64 / started.elapsed().as_secs_f64();
    Ok(BrokerCeiling {
        messages: n,
        message_bytes: body.len(),
        messages_per_sec: per_sec,
        orders_per_sec: per_sec / MESSAGES_PER_ORDER,
        cpu_ms_per_message: cpu.ms_per(n as f64),
    })
}

/// CPU of every process the bench reports, from a start.
pub struct Cpu(std::collections::BTreeMap<String, f64>);

impl Cpu {
    /// From now.
    pub fn start() -> Self {
        Self(testkit::process::cpu_seconds_by_command())
    }

    /// Milliseconds of CPU since the start, all processes, per one of `ops`.
    pub fn ms_per(&self, ops: f64) -> f64 {
        let after = testkit::process::cpu_seconds_by_command();
        super::cpu_per_order(&self.0, &after, 1).values().sum::<f64>() / ops.max(1.0)
    }
}

/// Runs `clients` copies of `op` for `duration`; operations per second and
/// CPU ms of every process per operation.
pub async fn tight_loop<F, Fut>(clients: usize, duration: Duration, op: F) -> anyhow::Result<(f64, f64)>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + duration;
    let cpu = Cpu::start();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients as u64 {
        let (op, done) = (op.clone(), done.clone());
        tasks.spawn(async move {
            let mut i = c << 32;
            while Instant::now() < end {
                op(i).await?;
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let ops = done.load(Ordering::Relaxed) as f64;
    Ok((ops / started.elapsed().as_secs_f64(), cpu.ms_per(ops)))
}

/// The order-create transaction and a consumer's inbox + effect transaction,
/// each in a tight loop of `clients` on a throw-away database.
pub async fn database(clients: usize, partitions: usize, duration: Duration) -> anyhow::Result<DatabaseCeiling> {
    let orders_db = testkit::TempDb::new("eo_bench_orders");
    let orders = order_api::connect(orders_db.url(), clients as u32 + 2).await?;
    let (create_tx_per_sec, create_cpu_ms) = tight_loop(clients, duration, move |i| {
        let pool = orders.clone();
        async move {
            let key = format!("bench-{i}");
            let request = idempotency::Keyed {
                scope: "bench",
                key: &key,
                fingerprint: "f",
                previous_fingerprint: None,
            };
            let idempotency::Begun::New(mut tx) = idempotency::begin(&pool, request).await? else {
                anyhow::bail!("a fresh key was answered without running");
            };
            let new = order_api::orders::NewOrder {
                sku: "WIDGET".into(),
                quantity: 1,
                amount_cents: 1_000,
                card_token: "tok_bench".into(),
                card_last4: "4242".into(),
            };
            let order = order_api::orders::insert(&mut tx, "bench", &new).await?;
            let first = Message::ReserveStock {
                sku: order.sku.clone(),
                quantity: order.quantity,
            };
            saga_kit::emit::emit(&mut tx, order.id, &first, None).await?;
            let response =
                idempotency::StoredResponse::json(axum::http::StatusCode::CREATED, &order, "application/json");
            idempotency::complete(&pool, tx, request, Duration::from_secs(3600), &response).await?;
            Ok(())
        }
    })
    .await?;

    let bare = sqlx::PgPool::connect(orders_db.url()).await?;
    sqlx::query("CREATE TABLE bench_bare (id uuid PRIMARY KEY, body text NOT NULL)")
        .execute(&bare)
        .await?;
    let (bare_commit_per_sec, bare_commit_cpu_ms) = tight_loop(clients, duration, move |_| {
        let pool = bare.clone();
        async move {
            sqlx::query("INSERT INTO bench_bare VALUES ($1, repeat('x', 300))")
                .bind(Uuid::new_v4())
                .execute(&pool)
                .await?;
            Ok(())
        }
    })
    .await?;

    let inventory_db = testkit::TempDb::new("eo_bench_inventory");
    let inventory = inventory_service::connect(inventory_db.url(), clients as u32 + 2).await?;
    sqlx::query("INSERT INTO stock (sku, available) VALUES ('WIDGET', 2000000000)")
        .execute(&inventory)
        .await?;
    let pool = inventory.clone();
    let (consumer_tx_per_sec, _) = tight_loop(clients, duration, move |_| {
        let pool = pool.clone();
        async move {
            inventory_service::stock::handle(&pool, sample_envelope())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        }
    })
    .await?;
    // A consumer runs one batch per partition at a time: as many loops as
    // a topic has partitions.
    let (batches_per_sec, batch_cpu_ms) = tight_loop(partitions.max(1), duration, move |_| {
        let pool = inventory.clone();
        async move {
            let batch = (0..CONSUMER_BATCH)
                .map(|_| kafka::consumer::Traced {
                    message: sample_envelope(),
                    span: tracing::Span::none(),
                    position: None,
                    producer: None,
                    header_event_id: None,
                })
                .collect();
            inventory_service::stock::handle_batch(&pool, batch)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        }
    })
    .await?;
    let consumer_batched_per_sec = batches_per_sec * CONSUMER_BATCH as f64;
    Ok(DatabaseCeiling {
        clients,
        create_tx_per_sec,
        consumer_tx_per_sec,
        consumer_batched_per_sec,
        orders_per_sec: 1.0 / (1.0 / create_tx_per_sec + CONSUMER_TRANSACTIONS_PER_ORDER / consumer_batched_per_sec),
        create_cpu_ms,
        bare_commit_per_sec,
        bare_commit_cpu_ms,
        consumer_batched_cpu_ms: batch_cpu_ms / CONSUMER_BATCH as f64,
    })
}
