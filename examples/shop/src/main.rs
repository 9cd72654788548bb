//! A reader's own service on the three crates: `POST /notes` is idempotent
//! (Idempotency-Key), writes the note and its event in one transaction
//! (outbox), a relay publishes the event to Kafka, and a consumer counts each
//! note once however often it is delivered (inbox). Environment:
//! DATABASE_URL, KAFKA_BROKERS, FINGERPRINT_KEY (32+ characters), ADDR.
use std::time::Duration;

use axum::extract::Extension;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idempotency::{Begun, FingerprintKey, Idempotent, Refused, Scope, Secret, StoredResponse};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use sqlx::PgPool;

/// This service's errors: a refusal of the key layer, or a failure.
struct Problem(StatusCode, String);
impl<E: std::error::Error> From<E> for Problem {
    fn from(e: E) -> Self {
        Self(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}
fn refused(r: Refused) -> Problem {
    Problem(r.status(), r.to_string())
}

async fn add_note(Extension(pool): Extension<PgPool>, request: Idempotent<Problem>) -> Result<Response, Problem> {
    let keyed = request.keyed();
    let mut tx = match idempotency::begin(&pool, keyed).await? {
        Begun::New(tx) => tx, // the key is ours: do the work in its transaction
        Begun::Answered(outcome) => return idempotency::respond(outcome).map_err(refused),
    };
    let text = String::from_utf8_lossy(&request.body).into_owned();
    let id = uuid::Uuid::now_v7();
    sqlx::query("INSERT INTO notes (id, text) VALUES ($1, $2)")
        .bind(id)
        .bind(&text)
        .execute(&mut *tx)
        .await?;
    let event = outbox::OutboxEvent::json("notes", id, uuid::Uuid::now_v7(), "NoteAdded", &text);
    outbox::enqueue(&mut tx, &event).await?; // the note and its event, or neither
    let created = StoredResponse::json(StatusCode::CREATED, &id, "application/json");
    let outcome = idempotency::complete(&pool, tx, keyed, Duration::from_secs(86_400), &created).await?;
    idempotency::respond(outcome).map_err(refused)
}

/// Counts each note once: inbox row and effect in one transaction, then the offset.
async fn count_notes(pool: PgPool, brokers: String) -> anyhow::Result<()> {
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "note-counter")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&["notes"])?;
    loop {
        let message = consumer.recv().await?;
        let header = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == outbox::kafka::EVENT_ID));
        let id = header.and_then(|h| std::str::from_utf8(h.value?).ok()?.parse::<uuid::Uuid>().ok());
        if let Some(id) = id {
            let (mut tx, fresh) = inbox::begin_batch(&pool, "note-counter", &[id.into()]).await?;
            if !fresh.is_empty() {
                sqlx::query("UPDATE note_stats SET notes = notes + 1")
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        consumer.commit_message(&message, CommitMode::Sync)?;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let var = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set"));
    let pool = PgPool::connect(&var("DATABASE_URL")?).await?;
    for mut migrator in [idempotency::migrator(), outbox::migrator(), inbox::migrator()] {
        migrator.set_ignore_missing(true).run(&pool).await?; // three crates, one database
    }
    sqlx::raw_sql(include_str!("schema.sql")).execute(&pool).await?;
    let brokers = var("KAFKA_BROKERS")?;
    let relay = outbox::Relay::new(pool.clone(), outbox::KafkaPublisher::new(&brokers)?, "shop");
    tokio::spawn(async move { relay.run(tokio_util::sync::CancellationToken::new()).await });
    let counter = count_notes(pool.clone(), brokers);
    let key = FingerprintKey::new(Secret::new(&var("FINGERPRINT_KEY")?).map_err(anyhow::Error::msg)?);
    let app = axum::Router::new()
        .route("/notes", axum::routing::post(add_note))
        .layer(Extension(Scope("every-client".into()))) // your authentication sets the caller's scope
        .layer(Extension(pool))
        .with_state(key); // the Idempotent extractor's fingerprint key
    let server = axum::serve(tokio::net::TcpListener::bind(var("ADDR")?).await?, app);
    // Whichever stops first (an error) ends the process: restart it, nothing is lost.
    tokio::select! { served = server => Ok(served?), counted = counter => counted }
}
