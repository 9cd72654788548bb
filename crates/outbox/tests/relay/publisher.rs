//! What the Kafka publisher puts on a record, and how the relay paces
//! itself when publishing fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use contract::{Envelope, Message};
use outbox::relay::{PendingRow, PublishError, Publisher};
use outbox::{KafkaPublisher, Relay};
use rdkafka::message::Headers as _;
use rdkafka::Message as _;
use uuid::Uuid;

use super::common::{outbox_event, setup, Db, SERIAL};
use super::drain;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every header of the first record on `topic`, by name.
pub async fn headers_of_first(brokers: &str, topic: &str) -> std::collections::BTreeMap<String, String> {
    let all = testkit::topics::read_all(brokers, topic).await.unwrap();
    let first = all.first().expect("a record on the topic");
    first
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    let value = String::from_utf8(h.value.unwrap_or_default().to_vec()).unwrap();
                    (h.key.to_owned(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes one row carrying `TRACEPARENT`, relays it with `publisher`, and
/// returns the row's envelope and the headers its record carries.
pub async fn publish_one(publisher: KafkaPublisher) -> (Envelope, std::collections::BTreeMap<String, String>) {
    let (_serial, brokers, db, topic) = setup().await;
    let order = Uuid::new_v4();
    let cause = Envelope::new(order, &Message::StockReserved, None);
    let mut env = Envelope::new(order, &Message::ReleaseStock, Some(&cause));
    env.traceparent = Some(TRACEPARENT.into());
    let mut tx = db.pool.begin().await.unwrap();
    outbox::enqueue(&mut tx, &outbox_event(&topic, &env)).await.unwrap();
    tx.commit().await.unwrap();
    drain(&Relay::new(db.pool.clone(), publisher, "t")).await;
    let headers = headers_of_first(&brokers, &topic).await;
    db.drop().await;
    (env, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_carries_the_rows_event_id_type_and_traceparent() {
    let brokers = testkit::broker::shared().await.unwrap();
    let (env, headers) = publish_one(KafkaPublisher::new(&brokers).unwrap()).await;
    assert_eq!(headers.get("event_id"), Some(&env.event_id.to_string()), "{headers:?}");
    assert_eq!(headers.get("event_type"), Some(&env.event_type), "{headers:?}");
    assert_eq!(
        headers.get("traceparent").map(String::as_str),
        Some(TRACEPARENT),
        "passed through as the row has it: {headers:?}"
    );
    // The body's correlation and causation ids, repeated as headers.
    assert_eq!(headers.get("correlation_id"), Some(&env.correlation_id.to_string()));
    let cause = env.causation_id.expect("caused").to_string();
    assert_eq!(headers.get("causation_id"), Some(&cause), "{headers:?}");
}

fn linked(_: &tracing::Span, _: Option<&str>) -> Option<String> {
    Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_link_decides_the_traceparent_the_record_carries() {
    let brokers = testkit::broker::shared().await.unwrap();
    let publisher = KafkaPublisher::new(&brokers).unwrap().trace_with(linked);
    let (_, headers) = publish_one(publisher).await;
    assert_eq!(
        headers.get("traceparent"),
        linked(&tracing::Span::none(), None).as_ref()
    );
}

/// Refuses every row as "try again", counting its calls.
struct Refusing(Arc<AtomicUsize>);

impl Publisher for Refusing {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        rows.iter()
            .map(|_| {
                Err(PublishError {
                    retriable: true,
                    message: "broker unavailable".into(),
                })
            })
            .collect()
    }
}

/// A batch the broker did not take pauses the relay with a backoff that
/// doubles from 100 ms: in 1.2 s, four or five attempts, not a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_pauses_the_relay_with_a_doubling_backoff() {
    let _serial = SERIAL.lock().await;
    let db = Db::new().await;
    db.enqueue("t", Uuid::new_v4(), 0).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let relay = Relay::new(db.pool.clone(), Refusing(calls.clone()), "t").poll_interval(Duration::from_millis(10));
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        async move { relay.run(token).await }
    });
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    token.cancel();
    run.await.unwrap();
    let n = calls.load(Ordering::SeqCst);
    // Attempts at 0, 0.1, 0.3, 0.7 s (and 1.5 s): 4, allowing one more for a slow machine.
    assert!((3..=5).contains(&n), "{n} publish attempts in 1.2 s");
    assert_eq!(db.pending().await, 1, "the row stays pending");
    db.drop().await;
}

/// The relay's metrics carry their help text once described.
#[tokio::test]
async fn described_metrics_render_with_their_help() {
    let _serial = SERIAL.lock().await;
    telemetry::metrics::install();
    outbox::describe_metrics();
    let db = Db::new().await;
    db.enqueue("t", Uuid::new_v4(), 0).await;
    drain(&Relay::new(db.pool.clone(), super::NullPublisher, "t")).await;
    let page = telemetry::metrics::render();
    for (name, help) in outbox::COUNTERS.iter().take(1) {
        assert!(page.contains(&format!("# HELP {name} {help}")), "{name}: {page}");
    }
    db.drop().await;
}

/// The backlog gauges: pending rows and the oldest one's age, 0 and 0 once
/// the relay has published them (what `OutboxNotDraining` alerts on).
#[tokio::test]
async fn the_backlog_gauges_count_pending_rows_and_the_oldest_ones_age() {
    let _serial = SERIAL.lock().await;
    telemetry::metrics::install();
    let db = Db::new().await;
    for i in 0..3 {
        db.enqueue("t", Uuid::new_v4(), i).await;
    }
    sqlx::query("UPDATE outbox SET created_at = now() - interval '30 seconds' WHERE id = (SELECT min(id) FROM outbox)")
        .execute(&db.pool)
        .await
        .unwrap();
    let relay = Relay::new(db.pool.clone(), super::NullPublisher, "backlog-test");
    let (pending, age) = relay.observe_backlog().await.unwrap();
    assert_eq!(pending, 3);
    assert!((30.0..60.0).contains(&age), "oldest pending {age} s");
    let gauge = |name| telemetry::metrics::get(name, &[("source", "backlog-test")]);
    assert_eq!(gauge("relay_pending_rows"), 3.0);
    assert!(gauge("outbox_oldest_pending_seconds") >= 30.0);
    drain(&relay).await;
    assert_eq!(relay.observe_backlog().await.unwrap(), (0, 0.0));
    assert_eq!(gauge("relay_pending_rows"), 0.0);
    db.drop().await;
}

/// Takes every row, but on its first call — the claim's transaction open,
/// idle — has that connection terminated first, as the chaos run's
/// `pg_terminate_backend` does: the batch's settling then fails at once,
/// without waiting, in the same poll as its claim.
struct KillsTheClaimingConnection {
    pool: sqlx::PgPool,
    calls: AtomicUsize,
}

impl Publisher for KillsTheClaimingConnection {
    fn publish(&self, rows: &[PendingRow]) -> impl std::future::Future<Output = Vec<Result<(), PublishError>>> + Send {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            // Synchronously (no await: the batch must not yield here), from a
            // thread of its own with a runtime of its own.
            let options = self.pool.connect_options();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    use sqlx::Connection as _;
                    let mut c = sqlx::PgConnection::connect_with(&options).await.unwrap();
                    sqlx::query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE datname = current_database() AND state = 'idle in transaction'",
                    )
                    .execute(&mut c)
                    .await
                    .unwrap();
                });
            })
            .join()
            .unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
        std::future::ready(rows.iter().map(|_| Ok(())).collect())
    }
}

/// Found by the long chaos run: a batch whose settling failed at once (its
/// connection dropped) ended in the same poll as its claim, before the
/// pipeline had counted the claim — and the count went below zero (a
/// panic, the relay's exit). Now the relay backs off, claims again, and
/// publishes every row. Removal tried: the pipeline without taking the
/// claim's outcome first (`claims.try_recv`): the relay panics with
/// "attempt to subtract with overflow" and this fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_settling_fails_at_once_does_not_stop_the_relay() {
    let _serial = SERIAL.lock().await;
    let db = Db::new().await;
    for seq in 0..5 {
        db.enqueue("t", Uuid::new_v4(), seq).await;
    }
    let publisher = KillsTheClaimingConnection {
        pool: db.pool.clone(),
        calls: AtomicUsize::new(0),
    };
    let relay = Relay::new(db.pool.clone(), publisher, "t").poll_interval(Duration::from_millis(10));
    super::common::run_until_drained(relay, &db).await;
    db.drop().await;
}

/// Refuses every row for good (too large, say), or as "try again".
struct RefusesRows {
    for_good: bool,
}

impl Publisher for RefusesRows {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        rows.iter()
            .map(|_| {
                Err(PublishError {
                    retriable: !self.for_good,
                    message: "refused".into(),
                })
            })
            .collect()
    }
}

/// A round counts a row refused for good as parked, not failed (a failed
/// row pauses the relay; a parked one must not), and a row refused for now
/// as failed. Found by cargo mutants: `failed = refused − parked` with `+`
/// survived every other test.
#[tokio::test]
async fn a_round_counts_parked_rows_apart_from_failed_ones() {
    let _serial = SERIAL.lock().await;
    let db = Db::new().await;
    for (for_good, want) in [(true, (0, 2)), (false, (2, 0))] {
        db.enqueue("t", Uuid::new_v4(), 0).await;
        db.enqueue("t", Uuid::new_v4(), 1).await;
        let round = Relay::new(db.pool.clone(), RefusesRows { for_good }, "t")
            .run_once()
            .await
            .unwrap();
        assert_eq!((round.failed, round.parked), want, "refused for good: {for_good}");
        sqlx::query("DELETE FROM outbox").execute(&db.pool).await.unwrap();
    }
    db.drop().await;
}

/// Takes every row after a pause, counting how many calls are in flight at
/// once (the most seen).
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

struct SlowCounting(Arc<InFlight>);

impl Publisher for SlowCounting {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        let now = self.0.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.0.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.0.now.fetch_sub(1, Ordering::SeqCst);
        rows.iter().map(|_| Ok(())).collect()
    }
}

/// The pipeline keeps at most `in_flight` batches at the broker, and uses
/// them: with 1, never two at once; with 3, three. Found by cargo mutants:
/// `delivering < in_flight` as `<=` (one batch more than asked) survived
/// every other test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_keeps_at_most_in_flight_batches_at_the_broker() {
    let _serial = SERIAL.lock().await;
    for in_flight in [1, 3] {
        let db = Db::new().await;
        // One row per order: every row is claimable at once, a batch of one each.
        for seq in 0..12 {
            db.enqueue("t", Uuid::new_v4(), seq).await;
        }
        let counts = Arc::new(InFlight::default());
        let relay = Relay::new(db.pool.clone(), SlowCounting(counts.clone()), "t")
            .batch(1)
            .in_flight(in_flight)
            .poll_interval(Duration::from_millis(10));
        super::common::run_until_drained(relay, &db).await;
        assert_eq!(
            counts.most.load(Ordering::SeqCst),
            in_flight,
            "batches at the broker at once"
        );
        db.drop().await;
    }
}
