//! Emitting a saga message from a service: the glue between the protocol
//! (`contract`) and the transactional outbox (`outbox`), which know nothing
//! of each other.

use contract::{Envelope, Message};
use sqlx::PgConnection;
use uuid::Uuid;

/// Builds the envelope for `message` about `order_id` — a new `event_id`,
/// caused by `cause` when given (continuing its correlation), the current
/// span's trace context — and enqueues it on the message's topic in the
/// caller's transaction. The relay's publish span becomes a child of that
/// context. Returns the envelope.
pub async fn emit(
    conn: &mut PgConnection,
    order_id: Uuid,
    message: &Message,
    cause: Option<&Envelope>,
) -> outbox::Result<Envelope> {
    emit_as(conn, order_id, message, cause, Uuid::now_v7()).await
}

/// [`emit`] under `event_id`, a new id the caller minted first — to record
/// it beside the state that waits on the message, in the same transaction.
pub async fn emit_as(
    conn: &mut PgConnection,
    order_id: Uuid,
    message: &Message,
    cause: Option<&Envelope>,
    event_id: Uuid,
) -> outbox::Result<Envelope> {
    let mut envelope = Envelope::new(order_id, message, cause);
    envelope.event_id = event_id;
    envelope.traceparent = telemetry::propagation::current();
    outbox::enqueue(conn, &outbox_event(message.topic(), &envelope)).await?;
    Ok(envelope)
}

/// Enqueues `message` about `order_id` again under `event_id` — the id it
/// was first sent with — so every reader that has it absorbs the copy (a
/// deadline's re-send; see `outbox::enqueue_again`). Returns the envelope.
pub async fn emit_again(
    conn: &mut PgConnection,
    order_id: Uuid,
    message: &Message,
    event_id: Uuid,
) -> outbox::Result<Envelope> {
    let mut envelope = Envelope::new(order_id, message, None);
    envelope.event_id = event_id;
    envelope.traceparent = telemetry::propagation::current();
    outbox::enqueue_again(conn, &outbox_event(message.topic(), &envelope)).await?;
    Ok(envelope)
}

/// The outbox row of `envelope` on `topic`: keyed by its order id, its
/// identity and trace context as the Kafka headers, the envelope as the body.
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

/// The envelope of `message` about `order_id` — a new event id, caused by
/// `cause` when given — in the trace of `span` (the cause's consumer span,
/// or the current one), for [`emit_all`]: what [`emit`] builds.
pub fn envelope(order_id: Uuid, message: &Message, cause: Option<&Envelope>, span: &tracing::Span) -> Envelope {
    let mut envelope = Envelope::new(order_id, message, cause);
    envelope.traceparent = telemetry::propagation::traceparent(span);
    envelope
}

/// Enqueues every `(message, envelope)` in the caller's transaction with
/// one statement, in the order given: [`emit`] for a batch's replies.
pub async fn emit_all(conn: &mut PgConnection, replies: &[(Message, Envelope)]) -> outbox::Result<()> {
    let events: Vec<_> = replies
        .iter()
        .map(|(message, envelope)| outbox_event(message.topic(), envelope))
        .collect();
    outbox::enqueue_all(conn, &events).await
}

/// [`emit_all`] for a consumer's replies: each is enqueued, and kept with
/// the inbox row of the event it answers (its `causation_id`), so that a
/// repeat of that event is answered again with the same reply, under the
/// same id ([`crate::consumer::begin`]). In the caller's transaction, the
/// one that recorded the inbox rows.
pub async fn reply_all(conn: &mut PgConnection, consumer: &str, replies: &[(Message, Envelope)]) -> outbox::Result<()> {
    // Each reply serialised once: the outbox row and the kept copy are the same bytes.
    let events: Vec<_> = replies
        .iter()
        .map(|(message, envelope)| outbox_event(message.topic(), envelope))
        .collect();
    let kept: Vec<(Uuid, inbox::Reply)> = replies
        .iter()
        .zip(&events)
        .filter_map(|((_, envelope), event)| {
            let reply = inbox::Reply {
                reply_id: envelope.event_id,
                topic: event.topic.to_owned(),
                message_key: event.key.clone(),
                event_type: envelope.event_type.clone(),
                body: event.body.clone(),
                traceparent: envelope.traceparent.clone(),
            };
            envelope.causation_id.map(|cause| (cause, reply))
        })
        .collect();
    if events.is_empty() {
        return Ok(());
    }
    if kept.is_empty() || !inbox::keeps_replies() {
        return outbox::enqueue_all(conn, &events).await;
    }
    // The outbox rows and their kept copies in one statement.
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH {}, {} SELECT count(*) FROM kept",
            inbox::record_replies_cte("kept", 1),
            outbox::enqueue_all_cte("sent", 9)
        )
    });
    let statement = outbox::bind_all(inbox::bind_replies(sqlx::query(&SQL), consumer, &kept), &events);
    let stored: i64 = sqlx::Row::get(&statement.fetch_one(conn).await?, 0);
    inbox::replies_kept(consumer, kept.len(), stored)?;
    Ok(())
}
