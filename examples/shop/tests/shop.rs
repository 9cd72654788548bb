//! The example service as its reader would run it, against a real
//! PostgreSQL and a real Kafka broker: a retried POST makes one note and
//! replays the first answer, a key reused for another body is refused, the
//! relay publishes each note's event once, and a copy of an event delivered
//! again is counted once.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message as _;

async fn post(http: &reqwest::Client, addr: &str, key: &str, body: &str) -> reqwest::Response {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = http
            .post(format!("http://{addr}/notes"))
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await;
        match sent {
            Ok(response) => return response,
            // Not listening yet: it is migrating and connecting.
            Err(e) if e.is_connect() && Instant::now() < end => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("the example service did not answer: {e}"),
        }
    }
}

async fn notes_counted(pool: &sqlx::PgPool, n: i64) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let counted: i64 = sqlx::query_scalar("SELECT notes FROM note_stats")
            .fetch_optional(pool)
            .await
            .unwrap()
            .unwrap_or(0);
        assert!(counted <= n, "{counted} notes counted, {n} written");
        if counted == n {
            return;
        }
        assert!(Instant::now() < end, "{counted} of {n} notes counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_post_is_one_note_and_a_redelivered_event_is_counted_once() {
    let (db, pool) = testkit::TempDb::with_pool("eo_shop", 2, vec![]).await.unwrap();
    let broker = testkit::broker::shared().await.unwrap();
    testkit::topics::create(&broker, &["notes"], 3).await.unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let mut service = tokio::process::Command::new(env!("CARGO_BIN_EXE_shop"))
        .env("DATABASE_URL", db.url())
        .env("KAFKA_BROKERS", &broker)
        .env("FINGERPRINT_KEY", "an-example-key-of-thirty-two-chars!")
        .env("ADDR", &addr)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();

    let first = post(&http, &addr, "k-1", "milk").await;
    assert_eq!(first.status(), 201);
    let id = first.text().await.unwrap();
    let retry = post(&http, &addr, "k-1", "milk").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), id, "the first answer, replayed");
    assert_eq!(
        post(&http, &addr, "k-1", "eggs").await.status(),
        422,
        "a key reused for another body"
    );
    assert_eq!(post(&http, &addr, "k-2", "bread").await.status(), 201);
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM notes")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(notes, 2, "two keys, two notes");
    notes_counted(&pool, 2).await;

    // The broker delivers one event again (as after a relay crash between
    // its publish and its mark): same event id, counted once.
    let log = testkit::topics::read_all(&broker, "notes").await.unwrap();
    assert_eq!(log.len(), 2, "one record per note");
    let copy = &log[0];
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker)
        .create()
        .unwrap();
    let record = FutureRecord::to("notes")
        .key(copy.key().unwrap())
        .payload(copy.payload().unwrap())
        .headers(copy.headers().unwrap().clone());
    producer.send(record, Duration::from_secs(5)).await.unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let absorbed = loop {
        let absorbed: Option<i32> = sqlx::query_scalar("SELECT redeliveries FROM inbox_redeliveries")
            .fetch_optional(&pool)
            .await
            .unwrap();
        if let Some(n) = absorbed {
            break n;
        }
        assert!(Instant::now() < end, "the copy never reached the consumer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(absorbed, 1, "the copy was absorbed by the inbox");
    notes_counted(&pool, 2).await;
    service.kill().await.unwrap();
    pool.close().await;
}
