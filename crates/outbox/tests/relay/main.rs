//! The relay against a real PostgreSQL and a real Apache Kafka broker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use contract::{Envelope, Message};
use outbox::relay::{PendingRow, PublishError, Publisher};
use outbox::{KafkaPublisher, Relay};
use uuid::Uuid;

mod common;
mod lost_ack;
mod publisher;

use common::{read_all, setup, setup_own_broker, Db, SERIAL};

async fn drain<P: Publisher>(relay: &Relay<P>) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let r = relay.run_once().await.unwrap();
        if r.claimed == 0 {
            return;
        }
        assert!(Instant::now() < end, "relay did not drain");
    }
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_publish_and_mark_publishes_again_with_the_same_event_id() {
    let (_serial, broker, db, topic) = setup().await;
    let mut ids = BTreeSet::new();
    for i in 0..5 {
        ids.insert(db.enqueue(&topic, Uuid::new_v4(), i).await.event_id);
    }
    let relay = std::sync::Arc::new(Relay::new(
        db.pool.clone(),
        KafkaPublisher::new(&broker).unwrap(),
        "test",
    ));
    // A panic at the crash point drops the claiming transaction uncommitted,
    // exactly as a killed process does.
    fail::cfg("relay::after_publish_before_mark", "1*panic").unwrap();
    let r = relay.clone();
    assert!(
        tokio::spawn(async move { r.run_once().await }).await.is_err(),
        "the crash point fired"
    );
    fail::remove("relay::after_publish_before_mark");
    assert_eq!(db.pending().await, 5, "nothing marked published");
    assert_eq!(read_all(&broker, &topic).await.len(), 5, "but the broker has them");

    let round = relay.run_once().await.unwrap();
    // Nothing recorded the first copies: the relay cannot tell these from
    // first publications (the consumers' inboxes count the copies).
    assert_eq!((round.published, round.resent), (5, 0));
    assert_eq!(db.pending().await, 0);
    assert_eq!(
        relay.run_once().await.unwrap().claimed,
        0,
        "published exactly once more"
    );
    let all = read_all(&broker, &topic).await;
    assert_eq!(all.len(), 10);
    let mut per_id: BTreeMap<Uuid, usize> = BTreeMap::new();
    for (_, env) in &all {
        *per_id.entry(env.event_id).or_default() += 1;
    }
    assert_eq!(
        per_id.keys().copied().collect::<BTreeSet<_>>(),
        ids,
        "same event ids, no new ones"
    );
    assert!(per_id.values().all(|n| *n == 2), "each row twice: {per_id:?}");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_never_double_claim_and_keep_each_orders_order() {
    let (_serial, broker, db, topic) = setup().await;
    enqueue_orders(&db, &topic, 40, 5).await;
    let publisher = KafkaPublisher::new(&broker).unwrap();
    let relays: Vec<_> = (0..3)
        .map(|i| Relay::new(db.pool.clone(), publisher.clone(), format!("r{i}")).batch(16))
        .collect();
    let pool = &db.pool;
    let rounds = futures::future::join_all(relays.iter().map(|r| async move {
        let mut claimed = 0;
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            let round = r.run_once().await.unwrap();
            claimed += round.claimed;
            if round.claimed == 0
                && sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox")
                    .fetch_one(pool)
                    .await
                    .unwrap()
                    == 0
            {
                break;
            }
        }
        claimed
    }))
    .await;
    assert_shared_once(&rounds, 200);
    assert_published_once_in_order(&broker, &topic, 200).await;
    db.drop().await;
}

/// Rows handled per relay: `total` in all (none twice), by at least two relays.
fn assert_shared_once(per_relay: &[usize], total: usize) {
    assert_eq!(
        per_relay.iter().sum::<usize>(),
        total,
        "every row handled exactly once across relays: {per_relay:?}"
    );
    assert!(
        per_relay.iter().filter(|n| **n > 0).count() >= 2,
        "the relays shared the work: {per_relay:?}"
    );
}

/// `orders` orders with `events` events each, enqueued round-robin (so every
/// batch mixes orders and holds at most a few events of each).
async fn enqueue_orders(db: &Db, topic: &str, orders: usize, events: i32) {
    let orders: Vec<Uuid> = (0..orders).map(|_| Uuid::new_v4()).collect();
    for seq in 0..events {
        for o in &orders {
            db.enqueue(topic, *o, seq).await;
        }
    }
}

/// The topic holds `expected` messages, none twice, and each order's events
/// in their insert order (within one key, i.e. one partition, the broker's
/// order is the publish order).
async fn assert_published_once_in_order(brokers: &str, topic: &str, expected: usize) {
    let all = read_all(brokers, topic).await;
    assert_eq!(all.len(), expected, "no row published twice, none missing");
    let mut last: BTreeMap<String, i32> = BTreeMap::new();
    for (key, env) in &all {
        let Message::ReserveStock { quantity, .. } = env.message().unwrap() else {
            panic!()
        };
        let prev = last.insert(key.clone(), quantity).unwrap_or(0);
        assert_eq!(quantity, prev + 1, "order {key}: event {quantity} after {prev}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pipelined_relays_keep_each_orders_order() {
    let (_serial, broker, db, topic) = setup().await;
    // The relay records through the `metrics` facade: a recorder to count in.
    telemetry::metrics::install();
    // Each order's 5 events adjacent, batches of 3: every order spans two
    // or three batches, which the relays claim at nearly the same time.
    for _ in 0..40 {
        let order = Uuid::new_v4();
        for seq in 0..5 {
            db.enqueue(&topic, order, seq).await;
        }
    }
    // Each relay keeps up to 3 small batches at the broker while claiming the
    // next, with its own producer like a separate relay process: nothing but
    // the head rule orders the publishes, within a relay's pipeline and
    // across relays.
    let token = tokio_util::sync::CancellationToken::new();
    let sources: Vec<String> = (0..3)
        .map(|i| format!("pipelined-{}-{i}", Uuid::new_v4().simple()))
        .collect();
    let runs: Vec<_> = sources
        .iter()
        .map(|source| {
            let publisher = KafkaPublisher::new(&broker).unwrap();
            let relay = Relay::new(db.pool.clone(), publisher, source).batch(3).in_flight(3);
            let token = token.clone();
            tokio::spawn(async move { relay.run(token).await })
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(60);
    while db.pending().await > 0 {
        assert!(Instant::now() < end, "relays did not drain the outbox");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    token.cancel();
    for run in runs {
        run.await.unwrap();
    }
    let per_relay: Vec<usize> = sources
        .iter()
        .map(|s| telemetry::metrics::get("relay_published_total", &[("source", s.as_str())]) as usize)
        .collect();
    assert_shared_once(&per_relay, 200);
    assert_published_once_in_order(&broker, &topic, 200).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_keeps_rows_pending_and_nothing_is_lost_when_it_returns() {
    let (_serial, mut broker, db, topic) = setup_own_broker().await;
    broker.kill().await;
    for i in 0..10 {
        db.enqueue(&topic, Uuid::new_v4(), i).await;
    }
    let relay = Relay::new(
        db.pool.clone(),
        KafkaPublisher::with_timeout(&broker.addr, Duration::from_secs(2)).unwrap(),
        "t",
    );
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.claimed, round.published, round.failed), (10, 0, 10));
    assert_eq!(db.pending().await, 10, "nothing marked while the broker is down");
    broker.restart().await.unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        let relay = Relay::new(db.pool.clone(), KafkaPublisher::new(&broker.addr).unwrap(), "t");
        async move { relay.run(token).await }
    });
    let end = Instant::now() + Duration::from_secs(40);
    while db.pending().await > 0 {
        assert!(Instant::now() < end, "relay did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    token.cancel();
    run.await.unwrap();
    let all = read_all(&broker.addr, &topic).await;
    let distinct: BTreeSet<Uuid> = all.iter().map(|(_, e)| e.event_id).collect();
    assert_eq!(distinct.len(), 10, "every row reached the broker");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_broker_rejects_for_good_is_parked_and_blocks_no_other_order() {
    let (_serial, broker, db, topic) = setup().await;
    let big_order = Uuid::new_v4();
    let mut tx = db.pool.begin().await.unwrap();
    let huge = Envelope::new(
        big_order,
        &Message::StockRejected {
            reason: "x".repeat(2_000_000),
        },
        None,
    );
    outbox::enqueue(&mut tx, &common::outbox_event(&topic, &huge))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let other = db.enqueue(&topic, Uuid::new_v4(), 0).await;
    let relay = Relay::new(db.pool.clone(), KafkaPublisher::new(&broker).unwrap(), "t");
    drain(&relay).await;
    let (parked, error): (bool, Option<String>) =
        sqlx::query_as("SELECT parked_at IS NOT NULL, last_error FROM outbox WHERE event_id = $1")
            .bind(huge.event_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(parked, "oversized row parked");
    assert!(error.is_some_and(|e| !e.is_empty()), "with its error");
    let published: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_published WHERE event_id = $1)")
        .bind(other.event_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(published, "the other order's row went out");
    db.drop().await;
}

/// Accepts everything instantly (no broker): isolates the database side.
struct NullPublisher;

impl Publisher for NullPublisher {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        rows.iter().map(|_| Ok(())).collect()
    }
}

#[tokio::test]
async fn retention_deletes_only_records_of_publications_older_than_the_window() {
    let _serial = SERIAL.lock().await;
    let db = Db::new().await;
    for i in 0..6 {
        db.enqueue("t", Uuid::new_v4(), i).await;
    }
    let relay = Relay::new(db.pool.clone(), NullPublisher, "t").batch(4);
    // Publish four (they leave the outbox, recorded); age two records past
    // the window; leave two rows pending and old.
    assert_eq!(relay.run_once().await.unwrap().published, 4);
    sqlx::query(
        "UPDATE outbox_published SET published_at = now() - interval '2 days'
         WHERE event_id IN (SELECT event_id FROM outbox_published ORDER BY created_at LIMIT 2)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE outbox SET created_at = now() - interval '5 days'")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        relay.purge_published(Duration::from_secs(86_400), 1).await.unwrap(),
        1,
        "batched"
    );
    assert_eq!(
        relay.purge_published(Duration::from_secs(86_400), 100).await.unwrap(),
        1
    );
    assert_eq!(
        relay.purge_published(Duration::from_secs(86_400), 100).await.unwrap(),
        0
    );
    let left: (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_published)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(left, (2, 2), "pending rows are never deleted, recent records stay");
    db.drop().await;
}

#[tokio::test]
async fn an_idle_relay_publishes_a_new_row_within_its_poll_interval() {
    let _serial = SERIAL.lock().await;
    let db = Db::new().await;
    let relay = Relay::new(db.pool.clone(), NullPublisher, "t").poll_interval(Duration::from_millis(10));
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        async move { relay.run(token).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await; // idle, probing
    let env = db.enqueue("t", Uuid::new_v4(), 0).await;
    let start = Instant::now();
    loop {
        let done: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_published WHERE event_id = $1)")
            .bind(env.event_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if done {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "an idle relay probing every 10 ms took {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    token.cancel();
    run.await.unwrap();
    db.drop().await;
}

/// The relay's role gets the outbox and nothing else of the database: the
/// privileges it needs on `outbox` and `outbox_published`, none on another
/// table; granting again is a no-op, a missing role an error. Removal
/// tried: `GRANT SELECT ON ALL TABLES` added — the other table is readable
/// and this fails.
#[tokio::test]
async fn the_relays_role_is_granted_the_outbox_and_nothing_else() {
    let _serial = SERIAL.lock().await;
    // Declared before the database, so dropped after it (a role with
    // privileges in a database cannot go first), even when this fails.
    let guard = DroppedRole(format!("eo_relay_test_{}", Uuid::new_v4().simple()));
    let db = Db::new().await;
    let role = guard.0.clone();
    sqlx::query(&format!("CREATE ROLE {role} NOLOGIN"))
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE orders (id int)")
        .execute(&db.pool)
        .await
        .unwrap();
    outbox::grant_relay(&db.pool, &role).await.unwrap();
    outbox::grant_relay(&db.pool, &role).await.unwrap();
    let may = |table: &'static str, privilege: &'static str| {
        let (pool, role) = (db.pool.clone(), role.clone());
        async move {
            sqlx::query_scalar::<_, bool>("SELECT has_table_privilege($1, $2, $3)")
                .bind(role)
                .bind(table)
                .bind(privilege)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    for (table, privilege, expected) in [
        ("outbox", "SELECT", true),
        ("outbox", "UPDATE", true),
        ("outbox", "DELETE", true),
        ("outbox", "INSERT", false),
        ("outbox_published", "SELECT", true),
        ("outbox_published", "INSERT", true),
        ("outbox_published", "UPDATE", true),
        ("outbox_published", "DELETE", true),
        ("orders", "SELECT", false),
        ("_sqlx_migrations", "SELECT", false),
    ] {
        assert_eq!(may(table, privilege).await, expected, "{privilege} on {table}");
    }
    assert!(outbox::grant_relay(&db.pool, "no_such_role_here").await.is_err());
    db.drop().await;
}

/// A test's role, dropped from the server when this is.
struct DroppedRole(String);

impl Drop for DroppedRole {
    fn drop(&mut self) {
        testkit::db::drop_roles_blocking(testkit::db::server_url(), vec![self.0.clone()]);
    }
}

/// Transactions the server has counted for the current database so far.
async fn transactions(pool: &sqlx::PgPool) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// An idle relay costs one probe per poll interval, not a claim per turn
/// of its loop: over 3 s at 100 ms, a few dozen transactions on its
/// database. (The server flushes a backend's counts at most once a second,
/// so the window starts and ends with a second's margin.) Removal tried:
/// `wait_for_rows` returning at once (cargo mutants' survivor) — the relay
/// claims in a loop, thousands of transactions, and this fails.
#[tokio::test]
async fn an_idle_relay_probes_once_per_poll_interval() {
    let _serial = SERIAL.lock().await;
    let db = Db::new().await;
    let relay = Relay::new(db.pool.clone(), NullPublisher, "t").poll_interval(Duration::from_millis(100));
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        async move { relay.run(token).await }
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = transactions(&db.pool).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = transactions(&db.pool).await - before;
    token.cancel();
    run.await.unwrap();
    // 30 probes and this test's own two reads; a spinning relay makes thousands.
    assert!(during < 150, "an idle relay ran {during} transactions in 3 s");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_ack_is_lost_is_retried_and_the_broker_keeps_one_copy() {
    let outcome = lost_ack::lost_ack_round().await;
    assert!(outcome.swallowed > 0, "the acknowledgement was really lost");
    let doubled: Vec<_> = outcome.copies.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "the idempotent producer's retry was appended again: {doubled:?}"
    );
}

/// A deadline's re-send puts a published row back in the outbox
/// (`enqueue_again`) and the relay publishes it again, but the record of
/// its first publication keeps its time: the chaos suite holds that time
/// against the broker's append time of the row's first copy, so a relay
/// that settled a row it never sent cannot be hidden by the re-send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_row_keeps_the_time_of_its_first_mark() {
    let (_serial, broker, db, topic) = setup().await;
    let env = db.enqueue(&topic, Uuid::new_v4(), 0).await;
    let relay = Relay::new(db.pool.clone(), KafkaPublisher::new(&broker).unwrap(), "test");
    drain(&relay).await;
    type Marks = (
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let marks = || async {
        sqlx::query_as::<_, Marks>("SELECT first_published_at, published_at FROM outbox_published WHERE event_id = $1")
            .bind(env.event_id)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let (first, published) = marks().await;
    assert!(first.is_some() && first == published, "{first:?} {published:?}");
    let mut conn = db.pool.acquire().await.unwrap();
    outbox::enqueue_again(&mut conn, &common::outbox_event(&topic, &env))
        .await
        .unwrap();
    drop(conn);
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pending, 1, "back in the outbox");
    assert_eq!(marks().await.0, first, "pending again, its first publication kept");
    drain(&relay).await;
    let (again, published) = marks().await;
    assert_eq!(again, first, "marked again, its first mark kept");
    assert!(published > first, "the latest mark moved: {published:?}");
    assert_eq!(read_all(&broker, &topic).await.len(), 2, "two copies in the log");
    db.drop().await;
}

/// The textbook loop (`Relay::run_simple`): one batch at a time, claim →
/// deliver → settle, a pause when nothing is pending. It publishes every
/// row, each order's in the order written (one batch of 4 rows at a time
/// over 3 orders: the head rule holds across batches), settles them all,
/// picks up a row written while it idles, and stops on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simple_loop_publishes_every_row_in_order_and_stops_on_shutdown() {
    let (_serial, broker, db, topic) = setup().await;
    let orders: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    for seq in 0..4 {
        for order in &orders {
            db.enqueue(&topic, *order, seq).await;
        }
    }
    let relay = Relay::new(db.pool.clone(), KafkaPublisher::new(&broker).unwrap(), "simple")
        .batch(4)
        .poll_interval(Duration::from_millis(20));
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        async move { relay.run_simple(token).await }
    });
    let pending = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let end = Instant::now() + Duration::from_secs(30);
    while pending().await > 0 {
        assert!(Instant::now() < end, "the simple loop left rows pending");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Idle now: a row written later goes out within a few poll intervals.
    db.enqueue(&topic, orders[0], 4).await;
    let end = Instant::now() + Duration::from_secs(5);
    while pending().await > 0 {
        assert!(Instant::now() < end, "the idle loop missed a new row");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    token.cancel();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("stops on shutdown")
        .unwrap();
    let log = read_all(&broker, &topic).await;
    assert_eq!(log.len(), 13, "each row once");
    for order in &orders {
        let seqs: Vec<String> = log
            .iter()
            .filter(|(key, _)| *key == order.to_string())
            .map(|(_, env)| match env.message().unwrap() {
                Message::ReserveStock { sku, .. } => sku,
                other => panic!("{other:?}"),
            })
            .collect();
        let written: Vec<String> = (0..seqs.len()).map(|s| format!("seq-{s}")).collect();
        assert_eq!(seqs, written, "order {order}: in the order written");
    }
    db.drop().await;
}
