//! A consumer that trusts a **Kafka transaction instead of an inbox** — the
//! negative control behind docs/faq.md "Why not Kafka transactions?", run by
//! `e2e/tests/e2e/transactions.rs`. Not part of the system: the services
//! never work this way.
//!
//! Each message is handled in one Kafka transaction, as Kafka's
//! exactly-once recipe has it: the input is read with
//! `isolation.level=read_committed`, the message's offset is sent to the
//! transaction (`send_offsets_to_transaction`) and `commit_transaction`
//! makes the offset — and whatever was produced in the transaction — visible
//! at once.
//!
//! - `--effect database` writes one row to PostgreSQL for the message. The
//!   row commits in PostgreSQL; Kafka cannot enlist it in its transaction.
//! - `--effect forward` produces a copy of the message to `--output` inside
//!   the transaction: read → process → write, all in Kafka.
//!
//! `--pause-after N` stops after the N-th message's effect and offsets were
//! sent to its transaction, before `commit_transaction`, prints `PAUSED <payload>` and waits there to be
//! SIGKILLed. Every committed message prints `COMMITTED <payload>`.

use std::io::Write as _;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::{Message, Offset, TopicPartitionList};

#[derive(Clone, Copy, ValueEnum)]
enum Effect {
    /// A row in PostgreSQL's `effects` table (outside the transaction).
    Database,
    /// A copy on the output topic (inside the transaction).
    Forward,
}

#[derive(Parser)]
#[command(about = "A Kafka-transactional consumer without an inbox (a negative control)")]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long)]
    brokers: String,
    /// The topic read (every partition, from the group's committed offsets).
    #[arg(long)]
    input: String,
    /// The consumer group whose offsets the transactions commit.
    #[arg(long)]
    group: String,
    /// The producer's `transactional.id`: a second process with the same id
    /// fences the first and aborts its open transaction.
    #[arg(long)]
    transactional_id: String,
    #[arg(long, value_enum)]
    effect: Effect,
    /// PostgreSQL, with a table `effects (payload text, worker int)`.
    #[arg(long, required_if_eq("effect", "database"))]
    database_url: Option<String>,
    /// The topic the forwarded copies go to.
    #[arg(long, required_if_eq("effect", "forward"))]
    output: Option<String>,
    /// Stop after this many effects, before the last one's transaction commits.
    #[arg(long)]
    pause_after: Option<u64>,
}

const WAIT: Timeout = Timeout::After(Duration::from_secs(30));

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pool = match &args.database_url {
        Some(url) => Some(sqlx::PgPool::connect(url).await?),
        None => None,
    };

    // The producer first: `init_transactions` fences an earlier process with
    // this transactional id and aborts its open transaction, so the offsets
    // fetched below are the last *committed* ones.
    let producer: FutureProducer = kafka::client_config(&args.brokers)
        .set("transactional.id", &args.transactional_id)
        .set("transaction.timeout.ms", "60000")
        .create()?;
    producer.init_transactions(WAIT)?;

    let consumer: StreamConsumer = kafka::client_config(&args.brokers)
        .set("group.id", &args.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(&args.input), WAIT)?;
    let mut partitions = TopicPartitionList::new();
    for topic in metadata.topics() {
        for p in topic.partitions() {
            partitions.add_partition(&args.input, p.id());
        }
    }
    // Start where the group's last committed transaction left off. A fresh
    // broker's group coordinator may not be ready yet (NotCoordinator): ask again.
    let mut tries = 0;
    let committed = loop {
        match consumer.committed_offsets(partitions.clone(), WAIT) {
            Ok(c) => break c,
            Err(e) if tries < 100 => {
                tries += 1;
                eprintln!("txn-worker: committed offsets: {e} (asking again)");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let mut assignment = TopicPartitionList::new();
    for e in committed.elements() {
        let start = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        assignment.add_partition_offset(e.topic(), e.partition(), start)?;
    }
    consumer.assign(&assignment)?;
    let group = consumer
        .group_metadata()
        .ok_or_else(|| anyhow::anyhow!("the consumer has no group metadata"))?;

    let mut handled = 0u64;
    loop {
        let message = consumer.recv().await?;
        let payload = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
        producer.begin_transaction()?;
        match args.effect {
            Effect::Database => {
                let pool = pool.as_ref().expect("clap requires --database-url");
                sqlx::query("INSERT INTO effects (payload, worker) VALUES ($1, $2)")
                    .bind(&payload)
                    .bind(std::process::id() as i32)
                    .execute(pool)
                    .await?;
            }
            Effect::Forward => {
                let output = args.output.as_deref().expect("clap requires --output");
                let key = message.key().unwrap_or_default();
                producer
                    .send(FutureRecord::to(output).key(key).payload(&payload), WAIT)
                    .await
                    .map_err(|(e, _)| e)?;
            }
        }
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(
            message.topic(),
            message.partition(),
            Offset::Offset(message.offset() + 1),
        )?;
        producer.send_offsets_to_transaction(&offsets, &group, WAIT)?;
        handled += 1;
        if args.pause_after == Some(handled) {
            // The effect is done (the row committed / the copy in the log,
            // uncommitted) and the offset is in the transaction; only the
            // commit is missing.
            println!("PAUSED {payload}");
            std::io::stdout().flush()?;
            std::future::pending::<()>().await;
        }
        producer.commit_transaction(WAIT)?;
        println!("COMMITTED {payload}");
        std::io::stdout().flush()?;
    }
}
