//! The duplicate-injection fault: copies of recent messages re-produced
//! with their event ids, racing the originals of orders still in flight.

use std::collections::BTreeSet;
use std::time::Duration;

use contract::Envelope;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rdkafka::producer::FutureProducer;
use uuid::Uuid;

use super::report::Duplicates;
use crate::stack::Stack;

/// Re-produces, with their event ids, up to 25 recent messages per topic —
/// those of orders still in flight first (their effects may still be
/// pending, so a duplicate races the original), then recent others. Each
/// copy carries the header [`INJECTED`], so the audit can tell, reading the
/// log back, which copy an inbox applied. Returns (injected, of which for
/// in-flight orders).
pub(super) async fn duplicates(
    stack: &Stack,
    rng: &mut StdRng,
    duplicates: &mut Duplicates,
) -> anyhow::Result<(usize, usize)> {
    let brokers = stack.kafka();
    let producer = kafka::producer(&brokers)?;
    let in_flight: BTreeSet<Uuid> = {
        use sqlx::Connection as _;
        let mut db = sqlx::PgConnection::connect(&stack.db_url("orders")).await?;
        sqlx::query_scalar("SELECT id FROM orders WHERE status NOT IN ('CONFIRMED', 'CANCELLED')")
            .fetch_all(&mut db)
            .await?
            .into_iter()
            .collect()
    };
    let (mut total, mut racing) = (0, 0);
    for topic in contract::topics::ALL {
        let group = format!("chaos-injector-{}", Uuid::new_v4());
        let (messages, _) = {
            let (b, t) = (brokers.clone(), topic.to_owned());
            // A node of the cluster may be restarting (a broker fault just
            // before): a failed metadata fetch is retried, not the run's end.
            tokio::task::spawn_blocking(move || {
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    match kafka::read_topic_at_most(
                        &b,
                        &t,
                        &group,
                        rdkafka::Offset::OffsetTail(60),
                        Duration::from_millis(1500),
                        180,
                    ) {
                        Err(e) if attempt < 10 => {
                            eprintln!("chaos: reading {t} for duplicates failed ({e}); again");
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        read => return read,
                    }
                }
            })
            .await??
        };
        use rdkafka::Message as _;
        let envelopes: Vec<Envelope> = messages
            .iter()
            .filter_map(|m| Envelope::from_bytes(m.payload().unwrap_or_default()).ok())
            .collect();
        let (live, done): (Vec<&Envelope>, Vec<&Envelope>) =
            envelopes.iter().partition(|e| in_flight.contains(&e.order_id));
        let racing_copies = 25.min(live.len());
        let mut picks: Vec<&Envelope> = live.choose_multiple(rng, racing_copies).copied().collect();
        let live_picked = picks.len();
        picks.extend(done.choose_multiple(rng, 25 - live_picked.min(25)).copied());
        for env in picks {
            publish(&producer, topic, env).await?;
            total += 1;
            *duplicates.injected.entry(topic.to_owned()).or_default() += 1;
        }
        racing += live_picked;
    }
    Ok((total, racing))
}

/// Re-produces, with their event ids and marked as injected, the last
/// `tail` messages of each partition of `topic`: copies every reader's inbox
/// must absorb (for a test that wants duplicates without a fault schedule).
/// Returns how many were produced.
pub async fn copy_recent(stack: &Stack, topic: &str, tail: i64) -> anyhow::Result<usize> {
    let (brokers, t) = (stack.kafka(), topic.to_owned());
    let group = format!("copier-{}", Uuid::new_v4());
    let (messages, _) = tokio::task::spawn_blocking(move || {
        kafka::read_topic_at_most(
            &brokers,
            &t,
            &group,
            rdkafka::Offset::OffsetTail(tail),
            Duration::from_millis(1500),
            usize::MAX,
        )
    })
    .await??;
    let producer = kafka::producer(&stack.kafka())?;
    let mut copied = 0;
    use rdkafka::Message as _;
    for m in &messages {
        if let Ok(envelope) = Envelope::from_bytes(m.payload().unwrap_or_default()) {
            publish(&producer, topic, &envelope).await?;
            copied += 1;
        }
    }
    Ok(copied)
}

/// Re-produces the last message of each partition of `topic` as a *new*
/// event: the same fact under a fresh `event_id` — what a producer that
/// minted ids at publish would send. Each reader's inbox sees it as new;
/// the business key behind it must stop it, and the consumer records an
/// inbox miss (`inbox_misses_total`). Returns how many were produced.
pub async fn republish_as_new(stack: &Stack, topic: &str) -> anyhow::Result<usize> {
    let (brokers, t) = (stack.kafka(), topic.to_owned());
    let group = format!("republisher-{}", Uuid::new_v4());
    let (messages, _) = tokio::task::spawn_blocking(move || {
        kafka::read_topic_at_most(
            &brokers,
            &t,
            &group,
            rdkafka::Offset::OffsetTail(1),
            Duration::from_millis(1500),
            usize::MAX,
        )
    })
    .await??;
    let producer = kafka::producer(&stack.kafka())?;
    let mut sent = 0;
    use rdkafka::Message as _;
    for m in &messages {
        if let Ok(first) = Envelope::from_bytes(m.payload().unwrap_or_default()) {
            let mut again = first.clone();
            again.event_id = Uuid::now_v7();
            publish(&producer, topic, &again).await?;
            sent += 1;
        }
    }
    Ok(sent)
}

/// The header that marks a copy the injector produced (the services ignore
/// it; the audit reads it from the log).
pub const INJECTED: &str = "chaos-injected";

/// Puts `envelope` on `topic` as the relay publishes an outbox row: keyed by
/// its order id, identity and trace context as headers — and marked [`INJECTED`].
async fn publish(producer: &FutureProducer, topic: &str, envelope: &Envelope) -> kafka::Result<()> {
    let headers = kafka::headers(
        &envelope.event_id.to_string(),
        &envelope.event_type,
        envelope.traceparent.as_deref(),
    )
    .insert(rdkafka::message::Header {
        key: INJECTED,
        value: Some("1"),
    });
    // The relay's stamp, as on the copy it duplicates.
    let headers = match contract::producers::of_type(&envelope.event_type) {
        Some(producer) => kafka::stamp(headers, producer),
        None => headers,
    };
    kafka::publish(
        producer,
        topic,
        &envelope.order_id.to_string(),
        &envelope.to_bytes(),
        headers,
    )
    .await
}
