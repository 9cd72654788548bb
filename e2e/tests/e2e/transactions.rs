//! Kafka's own exactly-once, shown for what it covers (docs/faq.md "Why not
//! Kafka transactions?"; the negative control `kafka-transaction-instead-of-inbox`
//! of docs/results/negative-controls.md).
//!
//! `txn-worker` (e2e/src/bin) handles each message in one Kafka transaction
//! — read_committed input, the offset sent to the transaction — and no inbox.
//! A real process is SIGKILLed after its effect and before its transaction
//! commits; a second process with the same transactional id fences it (the
//! open transaction is aborted, offsets with it) and reads the message again.
//! - A database effect is outside the transaction: it was applied twice.
//! - A forwarded copy is inside it: the log holds it twice, a read_committed
//!   reader sees it once.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use rdkafka::{Message, Offset, TopicPartitionList};
use testkit::{Broker, TempDb};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use uuid::Uuid;

const MESSAGES: usize = 5;
/// The killed worker pauses after this many effects (1-based).
const PAUSE_AFTER: usize = 3;

struct Run {
    broker: Broker,
    input: String,
    group: String,
    transactional_id: String,
    payloads: Vec<String>,
}

impl Run {
    /// A broker, an input topic with `MESSAGES` messages (one order key
    /// each, so they spread over the partitions), and the worker's ids.
    async fn new(output: Option<&str>) -> Run {
        let broker = Broker::start().await.expect("broker");
        let input = format!("txn-in-{}", Uuid::new_v4().simple());
        let mut topics = vec![input.as_str()];
        topics.extend(output);
        kafka::ensure_topics(&broker.addr, &topics).await.expect("topics");
        let producer = kafka::producer(&broker.addr).expect("producer");
        let mut payloads = Vec::new();
        for i in 0..MESSAGES {
            let payload = format!("message-{i}");
            // One key for all: one partition, so "the third handled" is the third sent.
            producer
                .send(
                    FutureRecord::to(&input).key("order-1").payload(&payload),
                    Timeout::After(Duration::from_secs(10)),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("send");
            payloads.push(payload);
        }
        Run {
            broker,
            input,
            group: format!("txn-group-{}", Uuid::new_v4().simple()),
            transactional_id: format!("txn-worker-{}", Uuid::new_v4().simple()),
            payloads,
        }
    }

    /// Starts a worker; its stdout lines are returned to follow.
    fn worker(&self, effect: &[&str], pause_after: Option<usize>) -> (Child, Lines<BufReader<ChildStdout>>) {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_txn-worker"));
        cmd.args(["--brokers", &self.broker.addr, "--input", &self.input])
            .args(["--group", &self.group, "--transactional-id", &self.transactional_id])
            .args(effect)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(n) = pause_after {
            cmd.args(["--pause-after", &n.to_string()]);
        }
        let mut child = cmd.spawn().expect("txn-worker starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        (child, lines)
    }
}

/// Reads lines until one equals `want`; panics after 60 s or at EOF.
async fn wait_line(lines: &mut Lines<BufReader<ChildStdout>>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("worker stdout") {
            let done = line == want;
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "the worker never printed {want:?}; it printed {seen:?}"
    );
    seen
}

/// SIGKILLs the worker where it paused: after the effect, before the commit.
async fn kill_paused(run: &Run, pause_after: usize, mut child: Child, lines: &mut Lines<BufReader<ChildStdout>>) {
    let paused = format!("PAUSED {}", run.payloads[pause_after - 1]);
    let seen = wait_line(lines, &paused).await;
    let committed: Vec<_> = seen.iter().filter(|l| l.starts_with("COMMITTED")).collect();
    assert_eq!(committed.len(), pause_after - 1, "{seen:?}");
    child.kill().await.expect("SIGKILL");
    let status = child.wait().await.expect("wait");
    assert!(!status.success(), "the worker died of the signal: {status}");
}

/// Every message of `topic` with the given isolation level, payloads counted.
fn read_all(brokers: &str, topic: &str, isolation: &str) -> BTreeMap<String, usize> {
    let consumer: BaseConsumer = kafka::client_config(brokers)
        .set("group.id", format!("reader-{}", Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("reader");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("metadata");
    let mut tpl = TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut counts = BTreeMap::new();
    let (mut idle_since, end) = (Instant::now(), Instant::now() + Duration::from_secs(30));
    while idle_since.elapsed() < Duration::from_secs(3) && Instant::now() < end {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                *counts.entry(payload).or_insert(0) += 1;
                idle_since = Instant::now();
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_transaction_in_place_of_the_inbox_applies_a_database_effect_twice_when_killed_before_its_commit() {
    let _share = crate::share().await;
    let run = Run::new(None).await;
    let (db, pool) = TempDb::with_tables(
        "eo_txn",
        vec![],
        "CREATE TABLE effects (payload text NOT NULL, worker int NOT NULL, at timestamptz DEFAULT clock_timestamp())",
    )
    .await
    .expect("database");
    let effect = ["--effect", "database", "--database-url", db.url()];

    let (first, mut lines) = run.worker(&effect, Some(PAUSE_AFTER));
    kill_paused(&run, PAUSE_AFTER, first, &mut lines).await;
    let (mut second, mut lines) = run.worker(&effect, None);
    let seen = wait_line(&mut lines, &format!("COMMITTED {}", run.payloads[MESSAGES - 1])).await;
    second.kill().await.expect("stop the second worker");

    // The second worker started at the killed transaction's message: its
    // offset was aborted with the transaction.
    assert_eq!(
        seen[0],
        format!("COMMITTED {}", run.payloads[PAUSE_AFTER - 1]),
        "{seen:?}"
    );
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT payload, count(*), count(DISTINCT worker) FROM effects GROUP BY payload ORDER BY payload",
    )
    .fetch_all(&pool)
    .await
    .expect("effects");
    let twice: Vec<_> = rows.iter().filter(|(_, n, _)| *n > 1).collect();
    assert_eq!(rows.len(), MESSAGES, "every message has its effect: {rows:?}");
    assert_eq!(
        twice,
        vec![&(run.payloads[PAUSE_AFTER - 1].clone(), 2, 2)],
        "the killed transaction's message was applied twice, once by each worker — the \
         transaction aborted its offset, not its database row: {rows:?}"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_forwarding_in_one_transaction_shows_a_read_committed_reader_no_duplicate() {
    let _share = crate::share().await;
    let output = format!("txn-out-{}", Uuid::new_v4().simple());
    let run = Run::new(Some(&output)).await;
    let effect = ["--effect", "forward", "--output", &output];

    let (first, mut lines) = run.worker(&effect, Some(PAUSE_AFTER));
    kill_paused(&run, PAUSE_AFTER, first, &mut lines).await;
    let (mut second, mut lines) = run.worker(&effect, None);
    let seen = wait_line(&mut lines, &format!("COMMITTED {}", run.payloads[MESSAGES - 1])).await;
    second.kill().await.expect("stop the second worker");
    assert_eq!(
        seen[0],
        format!("COMMITTED {}", run.payloads[PAUSE_AFTER - 1]),
        "{seen:?}"
    );

    let brokers = run.broker.addr.clone();
    let out = output.clone();
    let (committed, uncommitted) = tokio::task::spawn_blocking(move || {
        (
            read_all(&brokers, &out, "read_committed"),
            read_all(&brokers, &out, "read_uncommitted"),
        )
    })
    .await
    .expect("readers");
    let once: BTreeMap<String, usize> = run.payloads.iter().map(|p| (p.clone(), 1)).collect();
    assert_eq!(
        committed, once,
        "a read_committed reader sees every forwarded message once"
    );
    // The evidence that there was a duplicate to absorb: the killed
    // transaction's copy is in the log, behind its abort marker.
    let mut in_log = once.clone();
    in_log.insert(run.payloads[PAUSE_AFTER - 1].clone(), 2);
    assert_eq!(uncommitted, in_log, "the log holds the aborted copy as well");
}
