//! What a source may publish: the relay sends a service's outbox rows only
//! on the topics and with the message types that service produces
//! (`contract::producers`), stamped with that service's name. A row of
//! another service's message — a compromised inventory-service writing
//! `PaymentCaptured` into its own outbox — is refused for good: parked,
//! with the reason in its `last_error`, `relay_refused_total` and
//! `relay_parked_total` counting it, an error logged, and never sent.

use outbox::relay::{PendingRow, PublishError, Publisher};

/// The guard's metric, for its `# HELP`.
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "relay_refused_total": "Outbox rows refused (parked) because their service may not publish their type on their topic.",
];

/// A [`Publisher`] for one source's rows, in front of the real one.
#[derive(Clone)]
pub struct Guarded<P> {
    inner: P,
    producer: &'static str,
}

impl<P> Guarded<P> {
    /// `inner` for the outbox of `producer` (one of `contract::producers`).
    pub fn new(inner: P, producer: &'static str) -> Self {
        Self { inner, producer }
    }
}

impl<P: Publisher> Publisher for Guarded<P> {
    async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
        let verdicts: Vec<Result<(), String>> = rows
            .iter()
            .map(|r| contract::producers::check(self.producer, &r.topic, &r.event_type))
            .collect();
        // The usual case: every row is the source's own, sent as claimed.
        if verdicts.iter().all(Result::is_ok) {
            return self.inner.publish(rows).await;
        }
        let allowed: Vec<PendingRow> = rows
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| v.is_ok())
            .map(|(r, _)| r.clone())
            .collect();
        let mut sent = self.inner.publish(&allowed).await.into_iter();
        rows.iter()
            .zip(verdicts)
            .map(|(row, verdict)| match verdict {
                Ok(()) => sent.next().expect("one result per row sent"),
                Err(why) => {
                    tracing::error!(
                        producer = self.producer,
                        id = row.id,
                        topic = %row.topic,
                        event_type = %row.event_type,
                        event_id = %row.event_id,
                        reason = %why,
                        "outbox row refused: its service may not publish it"
                    );
                    telemetry::metrics::incr("relay_refused_total", &[("producer", self.producer)]);
                    Err(PublishError {
                        retriable: false,
                        message: format!("refused: {why}"),
                    })
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use contract::producers::INVENTORY;
    use contract::topics::{ORDER_EVENTS, PAYMENT_COMMANDS};

    use super::*;

    /// Sends nothing; remembers which rows it was given.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<i64>>>);

    impl Publisher for Seen {
        async fn publish(&self, rows: &[PendingRow]) -> Vec<Result<(), PublishError>> {
            self.0.lock().unwrap().extend(rows.iter().map(|r| r.id));
            rows.iter().map(|_| Ok(())).collect()
        }
    }

    fn row(id: i64, topic: &str, event_type: &str) -> PendingRow {
        PendingRow {
            id,
            topic: topic.into(),
            key: "k".into(),
            event_id: format!("e{id}"),
            event_type: event_type.into(),
            traceparent: None,
            body: "{}".into(),
        }
    }

    #[tokio::test]
    async fn a_source_sends_only_its_own_messages_on_their_topics() {
        let seen = Seen::default();
        let guarded = Guarded::new(seen.clone(), INVENTORY);
        let rows = [
            row(1, ORDER_EVENTS, "StockReserved"),
            row(2, ORDER_EVENTS, "PaymentCaptured"),
            row(3, PAYMENT_COMMANDS, "StockReserved"),
            row(4, ORDER_EVENTS, "StockReleased"),
        ];
        let results = guarded.publish(&rows).await;
        assert_eq!(*seen.0.lock().unwrap(), vec![1, 4], "only the source's own were sent");
        assert!(results[0].is_ok() && results[3].is_ok());
        for refused in [&results[1], &results[2]] {
            let e = refused.as_ref().unwrap_err();
            assert!(!e.retriable, "parked, not retried for ever");
            assert!(e.message.starts_with("refused: "), "{}", e.message);
        }
        assert!(results[1]
            .as_ref()
            .unwrap_err()
            .message
            .contains("inventory-service may not send PaymentCaptured"));
    }
}
