//! What the relay tests share: a throw-away database, a broker (one per test
//! binary unless the test kills it), reading a topic back.

use contract::{Envelope, Message};
use rdkafka::Message as _;
use sqlx::PgPool;
use testkit::{Broker, TempDb};
use tokio::sync::{Mutex, MutexGuard};
use uuid::Uuid;

/// Failpoints are process-global: tests that run the relay take turns.
pub static SERIAL: Mutex<()> = Mutex::const_new(());

pub struct Db {
    pub pool: PgPool,
    /// Dropped with this value, also when the test panics.
    _db: TempDb,
}

impl Db {
    pub async fn new() -> Self {
        let (db, pool) = TempDb::with_pool("eo_outbox", 8, vec![outbox::migrator()])
            .await
            .unwrap();
        Self { pool, _db: db }
    }

    pub async fn enqueue(&self, topic: &str, order: Uuid, seq: i32) -> Envelope {
        let mut tx = self.pool.begin().await.unwrap();
        let env = Envelope::new(
            order,
            &Message::ReserveStock {
                sku: format!("seq-{seq}"),
                quantity: seq + 1,
            },
            None,
        );
        outbox::enqueue(&mut tx, &outbox_event(topic, &env)).await.unwrap();
        tx.commit().await.unwrap();
        env
    }

    pub async fn pending(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Closes the pool; the database goes with `_db`.
    pub async fn drop(self) {
        self.pool.close().await;
    }
}

/// Takes this test's turn, and gives it the test binary's shared broker (its
/// address), a database and a topic of its own. A test that kills its broker
/// starts one with [`setup_own_broker`] instead.
pub async fn setup() -> (MutexGuard<'static, ()>, String, Db, String) {
    let serial = SERIAL.lock().await;
    let addr = testkit::broker::shared().await.unwrap();
    let db = Db::new().await;
    let topic = topic();
    testkit::topics::create(&addr, &[&topic], 3).await.unwrap();
    (serial, addr, db, topic)
}

/// As [`setup`], with a broker of the test's own, to kill and restart.
pub async fn setup_own_broker() -> (MutexGuard<'static, ()>, Broker, Db, String) {
    let serial = SERIAL.lock().await;
    let broker = Broker::start().await.unwrap();
    let db = Db::new().await;
    let topic = topic();
    testkit::topics::create(&broker.addr, &[&topic], 3).await.unwrap();
    (serial, broker, db, topic)
}

/// Runs `relay`'s pipeline until `db`'s outbox has nothing pending (20 s
/// at most; the relay must not stop meanwhile), then shuts it down.
pub async fn run_until_drained<P: outbox::relay::Publisher + Send + Sync + 'static>(relay: outbox::Relay<P>, db: &Db) {
    let token = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        async move { relay.run(token).await }
    });
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while db.pending().await > 0 {
        assert!(!run.is_finished(), "the relay stopped");
        assert!(
            std::time::Instant::now() < end,
            "{} rows still pending",
            db.pending().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    token.cancel();
    run.await.expect("the relay ran to its shutdown");
}

pub fn topic() -> String {
    format!("relay-test-{}", Uuid::new_v4().simple())
}

/// Every message on `topic` from the beginning: (key, envelope), per partition in offset order.
pub async fn read_all(brokers: &str, topic: &str) -> Vec<(String, Envelope)> {
    testkit::topics::read_all(brokers, topic)
        .await
        .unwrap()
        .iter()
        .map(|m| {
            let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
            (key, Envelope::from_bytes(m.payload().unwrap()).unwrap())
        })
        .collect()
}

/// The outbox row of `envelope` on `topic`, as `saga_kit::emit` writes it
/// (the outbox crate cannot depend on the saga's glue, which depends on it).
pub fn outbox_event<'a>(topic: &'a str, envelope: &'a Envelope) -> outbox::OutboxEvent<'a> {
    outbox::OutboxEvent::json(
        topic,
        envelope.order_id,
        envelope.event_id,
        &envelope.event_type,
        envelope,
    )
    .traceparent(envelope.traceparent.as_deref())
}
