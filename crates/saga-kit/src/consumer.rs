//! A service's saga consumer as supervised tasks: the consume loop on its
//! topic and the retention of its inbox, which live and die together — and
//! [`begin`] / [`commit`], the transaction every batching consumer's
//! handler opens with its inbox rows and closes with its effects.

use std::future::Future;
use std::time::Duration;

use contract::topics::consumers::Consumer;
use contract::Envelope;
use kafka::consumer::{ConsumerSettings, HandleError, Handled, Traced};
use kafka::KafkaArgs;
use sqlx::{PgPool, Postgres, Transaction};

use service_kit::Supervisor;

/// Crash point (failpoints builds): abort with the batch's transaction
/// open — its inbox rows and its effects written, not committed. Reached
/// only by a batch with an event new to the inbox (one of redelivered copies
/// only has nothing to lose). Correct code loses nothing here: the
/// transaction dies with the process and the batch is redelivered. Code
/// that made "processed" durable before the effect, or acknowledged the
/// batch before handling it, loses the batch's effects here — which is why
/// every chaos run arms this point in every consumer.
pub const CRASH_IN_TRANSACTION: &str = "consumer::in_transaction";

/// Aborts the process at [`CRASH_IN_TRANSACTION`] when armed.
fn crash_point_in_transaction() {
    fail::fail_point!(CRASH_IN_TRANSACTION, |_| telemetry::crash_point(CRASH_IN_TRANSACTION));
}

/// Begins a batch's transaction with its inbox rows
/// ([`inbox::begin_batch`], each envelope's source in the log recorded):
/// apply the effects of [`inbox::Fresh::indices`] in the transaction, then
/// [`commit`]. A handler reads, in one function:
///
/// ```ignore
/// let (mut tx, fresh) = saga_kit::consumer::begin(pool, INVENTORY.name, &batch).await?;
/// apply(&mut tx, &batch, &fresh.indices()).await.map_err(saga_kit::consumer::classify)?;
/// saga_kit::consumer::commit(tx, &fresh).await
/// ```
pub async fn begin(
    pool: &PgPool,
    consumer: &str,
    batch: &[Traced<Envelope>],
) -> Result<(Transaction<'static, Postgres>, inbox::Fresh), HandleError> {
    let deliveries: Vec<inbox::Delivery> = batch
        .iter()
        .map(|t| inbox::Delivery {
            event_id: t.message.event_id,
            source: t.position.map(|p| (p.partition, p.offset)),
            fingerprint: Some(inbox::Fingerprint {
                event_type: t.message.event_type.clone(),
                digest: t.message.fingerprint(),
            }),
        })
        .collect();
    let (mut tx, fresh) = inbox::begin_batch(pool, consumer, &deliveries)
        .await
        .map_err(classify)?;
    if let Some(i) = fresh.reused() {
        // Rolled back with `tx`; the loop then hands the batch over one by
        // one, and the reused id alone is dead-lettered — counted then.
        let event = &batch[i].message;
        if batch.len() == 1 {
            telemetry::metrics::incr("inbox_reused_ids_total", &[("consumer", consumer)]);
        }
        return Err(HandleError::permanent(format!(
            "event id reused: {} was recorded by {consumer} for another fact; this copy is a {} with another body",
            event.event_id, event.event_type
        )));
    }
    answer_again(&mut tx, consumer, batch, &fresh).await.map_err(classify)?;
    Ok((tx, fresh))
}

/// Answers each repeated event of the batch (one this consumer applied in
/// an earlier transaction) with the replies its effect emitted then
/// ([`crate::emit::reply_all`]), enqueued again under their first event ids
/// (`outbox::enqueue_again`): a reply lost after it was sent — dead-lettered
/// by its reader, say — is sent again when the command is, and a reader
/// that has it absorbs the copy.
async fn answer_again(
    tx: &mut sqlx::PgConnection,
    consumer: &str,
    batch: &[Traced<Envelope>],
    fresh: &inbox::Fresh,
) -> Result<(), outbox::Error> {
    let mut repeated: Vec<uuid::Uuid> = fresh
        .recorded()
        .iter()
        .zip(batch)
        .filter(|(r, _)| **r == inbox::Recorded::Duplicate)
        .map(|(_, t)| t.message.event_id)
        .collect();
    repeated.sort_unstable();
    repeated.dedup();
    for (_, reply) in inbox::replies_of(tx, consumer, &repeated).await? {
        let event = outbox::OutboxEvent {
            topic: &reply.topic,
            key: reply.message_key.clone(),
            event_id: reply.reply_id,
            event_type: &reply.event_type,
            traceparent: reply.traceparent.as_deref(),
            body: reply.body.clone(),
        };
        outbox::enqueue_again(tx, &event).await?;
        telemetry::metrics::incr("consumer_replies_sent_again_total", &[("consumer", consumer)]);
    }
    Ok(())
}

/// Commits a batch's transaction — its inbox rows and effects together —
/// and returns one outcome per envelope: applied if it was fresh, else a
/// duplicate. With fresh work in it, the chaos suite's
/// [`CRASH_IN_TRANSACTION`] may abort the process just before.
pub async fn commit(tx: Transaction<'static, Postgres>, fresh: &inbox::Fresh) -> Result<Vec<Handled>, HandleError> {
    if !fresh.is_empty() {
        crash_point_in_transaction();
    }
    tx.commit().await.map_err(classify)?;
    Ok(fresh
        .recorded()
        .iter()
        .map(|r| match r {
            inbox::Recorded::New => Handled::Applied,
            // A reused id never gets here: `begin` refused its batch.
            inbox::Recorded::Duplicate | inbox::Recorded::Reused => Handled::Duplicate,
        })
        .collect())
}

/// Records, in the handler's transaction, that `event_id` passed
/// `consumer`'s inbox as new although its effect was already applied for
/// `order_id` — the business key `caught_by` stopped it
/// ([`inbox::note_miss`]) — and counts it in `inbox_misses_total`, which
/// an alert watches: the inbox promises zero, so one is a deduplication bug
/// (or a negative control) to look at.
pub async fn note_miss(
    conn: &mut sqlx::PgConnection,
    consumer: &str,
    event_id: uuid::Uuid,
    order_id: uuid::Uuid,
    caught_by: &str,
) -> sqlx::Result<()> {
    inbox::note_miss(conn, consumer, event_id, order_id, caught_by).await?;
    telemetry::metrics::incr(
        "inbox_misses_total",
        &[("consumer", consumer), ("caught_by", caught_by)],
    );
    Ok(())
}

/// A handler's error, classified by the database error behind it (found
/// among its sources), so the consume loop knows what a retry can do:
///
/// - SQLSTATE class 22 (data exception) or 23 (integrity constraint
///   violation): the same statement fails the same way every time —
///   **permanent**, the message is dead-lettered and its partition moves on;
/// - no connection (I/O, TLS, the pool timed out or closed), SQLSTATE class
///   08 (connection exception), 53 (insufficient resources) or 57P0x (the
///   server shutting down or starting): the database is down —
///   **unavailable**, retried for as long as it takes, nothing dead-lettered;
/// - anything else (a serialisation failure, a deadlock, a timeout, an
///   error with no database error behind it): **transient**, retried up to
///   the consumer's attempts.
///
/// The error is kept whole, as the cause (its chain of sources with it).
pub fn classify(e: impl Into<anyhow::Error>) -> HandleError {
    let e: anyhow::Error = e.into();
    let code = match e.chain().find_map(|c| c.downcast_ref::<sqlx::Error>()) {
        Some(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
        Some(
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed,
        ) => return HandleError::unavailable(e),
        _ => None,
    };
    match code.as_deref().unwrap_or("") {
        c if c.starts_with("22") || c.starts_with("23") => HandleError::permanent(e),
        c if c.starts_with("08") || c.starts_with("53") || c.starts_with("57P0") => HandleError::unavailable(e),
        _ => HandleError::transient(e),
    }
}

/// A batch handler's answer for one envelope, handled as a batch of one in
/// the caller's span: the single-message entry of a batching consumer (its
/// tests, a replay by hand) takes the same path as its loop.
pub async fn handle_one<F, Fut>(envelope: Envelope, handle_batch: F) -> Result<Handled, HandleError>
where
    F: FnOnce(Vec<Traced<Envelope>>) -> Fut,
    Fut: Future<Output = Result<Vec<Handled>, HandleError>>,
{
    let one = Traced {
        message: envelope,
        span: tracing::Span::current(),
        position: None,
        producer: None,
        header_event_id: None,
    };
    let mut handled = handle_batch(vec![one]).await?;
    Ok(handled.pop().expect("one outcome per envelope"))
}

/// One consumer of the saga.
#[derive(Debug, Clone)]
pub struct SagaConsumer {
    /// Who it is and what it reads (`contract::topics::consumers`).
    pub consumer: Consumer,
    /// The broker.
    pub kafka: KafkaArgs,
    /// The service's database, which holds its inbox.
    pub pool: PgPool,
    /// How long inbox rows are kept (must exceed the broker's redelivery window).
    pub inbox_retention: Duration,
    /// How often the rows past it are purged (`service_kit::periodic::PURGE_EVERY`).
    pub purge_every: Duration,
}

impl SagaConsumer {
    /// `consumer`, with the service's broker and inbox retention settings and its database.
    pub fn new(consumer: Consumer, args: &crate::participant::ParticipantArgs, pool: &PgPool) -> Self {
        let (kafka, inbox) = (&args.kafka, &args.inbox);
        Self {
            consumer,
            kafka: kafka.clone(),
            pool: pool.clone(),
            inbox_retention: inbox.window(),
            purge_every: service_kit::periodic::PURGE_EVERY,
        }
    }
}

impl SagaConsumer {
    /// Runs this consumer under `tasks`' supervision, the inbox retention
    /// beside it, for a handler that applies a partition's queued envelopes
    /// (up to `KAFKA_CONSUMER_MAX_BATCH`) in one transaction:
    /// `handler(state.clone(), envelopes)` returns one outcome per envelope,
    /// all committed, or an error with none committed. Each envelope comes
    /// with its consumer span, for the work done on it.
    pub fn spawn_batches<S, H, F>(self, tasks: &mut Supervisor, state: S, handler: H)
    where
        S: Clone + Send + Sync + 'static,
        H: Fn(S, Vec<Traced<Envelope>>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Vec<Handled>, HandleError>> + Send + 'static,
    {
        let topic = self.consumer.topic;
        let (settings, pool, retention) = self.into_parts();
        let name = settings.group_id.clone();
        let token = tasks.token();
        let handler = std::sync::Arc::new(handler);
        // Started while Kafka is down, the service waits, not ready, until a
        // broker answers; then it makes sure of its topic (a
        // partition count it cannot run on ends it) and joins its group.
        let waiting = tasks.health().wait_for("kafka");
        tasks.spawn(format!("{name} consumer"), async move {
            // Its own topic and dead-letter topic only: its principal may
            // touch no others.
            let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
            if !settings.kafka.ready_for(&topics, token.clone()).await? {
                return Ok(());
            }
            drop(waiting);
            let consumer: std::sync::Arc<str> = settings.group_id.as_str().into();
            kafka::consumer::run_batches(settings, token, move |envelopes| {
                let admitted = admit(&consumer, topic, &envelopes);
                let (handler, state) = (handler.clone(), state.clone());
                async move {
                    admitted?;
                    handler(state, envelopes).await
                }
            })
            .await
        });
        spawn_retention(tasks, &name, pool, retention);
    }
}

/// Whether every envelope of a batch comes from the service that sends its
/// type on `topic` (`contract::producers`), as the relay stamped it, and
/// carries in its `event_id` header the id of its body: a forged reply —
/// another service's message in a participant's outbox, a record without
/// the relay's stamp, a header that names another event — is refused, a
/// permanent error. The
/// consumer then handles the batch's messages one by one and dead-letters
/// the refused one, with the reason; `consumer_refused_total` counts it
/// once (when it is refused alone) and an alert watches it.
pub fn admit(consumer: &str, topic: &str, batch: &[Traced<Envelope>]) -> Result<(), HandleError> {
    for t in batch {
        let producer = t.producer.as_deref().unwrap_or("an unstamped record");
        let checked = contract::producers::check(producer, topic, &t.message.event_type).and_then(|()| {
            // The identity the record's header carries is the body's, or
            // a reader deduplicating on one would be fooled by the other.
            match &t.header_event_id {
                Some(h) if h.parse::<uuid::Uuid>().ok() != Some(t.message.event_id) => Err(format!(
                    "the record's event_id header {h} is not its body's {}",
                    t.message.event_id
                )),
                _ => Ok(()),
            }
        });
        if let Err(why) = checked {
            if batch.len() == 1 {
                tracing::error!(
                    consumer,
                    event_id = %t.message.event_id,
                    event_type = %t.message.event_type,
                    producer,
                    reason = %why,
                    "event refused: not from the service that sends it"
                );
                telemetry::metrics::incr("consumer_refused_total", &[("consumer", consumer)]);
            }
            return Err(HandleError::permanent(format!("refused: {why}")));
        }
    }
    Ok(())
}

/// Purges the consumer's inbox rows older than `retention` every `every`.
fn spawn_retention(tasks: &mut Supervisor, name: &str, pool: PgPool, (retention, every): (Duration, Duration)) {
    let task = format!("{name} inbox retention");
    tasks.spawn_purge(task, every, pool, move |pool, n| async move {
        inbox::purge(&mut *pool.acquire().await?, retention, n).await
    });
}

impl SagaConsumer {
    fn into_parts(self) -> (ConsumerSettings, PgPool, (Duration, Duration)) {
        let Consumer { name, topic } = self.consumer;
        let settings = ConsumerSettings {
            max_batch: self.kafka.consumer_max_batch.into(),
            kafka: self.kafka,
            group_id: name.into(),
            topics: vec![topic.into()],
        };
        (settings, self.pool, (self.inbox_retention, self.purge_every))
    }
}

#[cfg(test)]
mod tests {
    use contract::{Envelope, Message};
    use kafka::consumer::Traced;

    use super::admit;

    fn record(message: &Message, producer: Option<&str>, header: Option<String>) -> Traced<Envelope> {
        let envelope = Envelope::new(uuid::Uuid::now_v7(), message, None);
        let header_event_id = header.or_else(|| Some(envelope.event_id.to_string()));
        Traced {
            message: envelope,
            span: tracing::Span::none(),
            position: None,
            producer: producer.map(str::to_owned),
            header_event_id,
        }
    }

    /// Admitted: the type's own producer, its topic, the body's id in the
    /// header. Refused: another producer, no stamp, a header naming another
    /// event — one such record refuses its whole batch (which the consumer
    /// then handles one by one). Removal tried: the header check dropped
    /// -> this test failed.
    #[test]
    fn only_the_types_own_producer_with_the_bodys_id_is_admitted() {
        let captured = Message::PaymentCaptured { charge_id: "ch".into() };
        let topic = contract::topics::ORDER_EVENTS;
        let good = record(&captured, Some(contract::producers::PAYMENT), None);
        assert!(admit("order-saga", topic, std::slice::from_ref(&good)).is_ok());
        // A refusal is counted when the record is refused alone — once the
        // consumer hands the batch's records over one by one — not for the
        // whole batch before that.
        let refused = || telemetry::metrics::get("consumer_refused_total", &[("consumer", "admit-test")]);
        let forged = record(&captured, Some(contract::producers::INVENTORY), None);
        let before = refused();
        assert!(admit("admit-test", topic, &[good.clone(), forged.clone()]).is_err());
        assert_eq!(refused(), before, "not for a batch");
        assert!(admit("admit-test", topic, std::slice::from_ref(&forged)).is_err());
        assert_eq!(refused(), before + 1.0, "once, alone");
        for (bad, why) in [
            (
                record(&captured, Some(contract::producers::INVENTORY), None),
                "may not send",
            ),
            (record(&captured, None, None), "an unstamped record"),
            (
                record(
                    &captured,
                    Some(contract::producers::PAYMENT),
                    Some(uuid::Uuid::now_v7().to_string()),
                ),
                "is not its body's",
            ),
        ] {
            let refused = admit("order-saga", topic, &[good.clone(), bad]).unwrap_err().report();
            assert!(
                refused.starts_with("permanent: refused: ") && refused.contains(why),
                "{refused}"
            );
        }
    }
}
