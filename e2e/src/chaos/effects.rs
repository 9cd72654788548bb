//! Each event against its inbox row and its effect, from ground truth: the
//! broker's log, the inboxes and the domain rows — a reservation movement,
//! a payment operation, a saga transition. The inbox and its effect commit
//! in one transaction and the offset after it, so after the system drained:
//!
//! - every event in a topic's log has its consumer's inbox row (the group
//!   committed past every offset: a missing row is an event acknowledged
//!   and never handled — offsets stored before handling);
//! - every inbox row has its effect (a row without one is an event marked
//!   handled whose effect was lost — the inbox committed apart);
//! - every effect has its event's inbox row (an effect without one was
//!   applied by a consumer that recorded nothing — the inbox off);
//! - every inbox row names where in the log its copy was read.

use std::collections::{BTreeMap, BTreeSet};

use contract::topics::consumers::{self, Consumer};
use sqlx::Connection as _;
use uuid::Uuid;

use super::provenance::{Event, Log};
use crate::stack::Stack;

/// What the four checks found: per check, how many and the first few in words.
#[derive(Debug, Clone, Default)]
pub(super) struct Findings {
    /// Events in the log their consumer's inbox does not hold.
    pub never_handled: Vec<String>,
    /// Inbox rows whose effect is not there.
    pub handled_without_effect: Vec<String>,
    /// Effects whose event has no inbox row.
    pub effect_without_inbox: Vec<String>,
    /// Inbox rows with no source in the log.
    pub inbox_without_source: Vec<String>,
}

/// The domain rows the checks read, and each consumer's inbox.
#[derive(Debug, Clone, Default)]
pub(super) struct Ground {
    /// Per consumer: its inbox's event ids.
    pub inbox: BTreeMap<&'static str, BTreeSet<Uuid>>,
    /// Per consumer: inbox rows without their source.
    pub sourceless: BTreeMap<&'static str, Vec<Uuid>>,
    /// The saga's history: the event ids of the replies it handled.
    pub transitions: BTreeSet<Uuid>,
    /// Reservations: order → status.
    pub reservations: BTreeMap<Uuid, String>,
    /// Payment operations: (order, kind) → settled by a command (not
    /// PENDING, not settled by the reconciler).
    pub payments: BTreeMap<(Uuid, String), bool>,
}

/// The saga's replies: the causes its history records with their event ids.
const REPLIES: [&str; 7] = [
    "StockReserved",
    "StockRejected",
    "StockReleased",
    "PaymentCaptured",
    "PaymentDeclined",
    "PaymentRefunded",
    "RefundFailed",
];

/// Whether `ground` holds the effect of `event`, handled by `consumer`.
fn has_effect(consumer: &Consumer, event_id: Uuid, event: &Event, ground: &Ground) -> Option<bool> {
    let order = event.order_id;
    Some(match (consumer.name, event.event_type.as_str()) {
        (c, _) if c == consumers::ORDER_SAGA.name => ground.transitions.contains(&event_id),
        (c, "ReserveStock") if c == consumers::INVENTORY.name => ground.reservations.contains_key(&order),
        (c, "ReleaseStock") if c == consumers::INVENTORY.name => {
            ground.reservations.get(&order).is_some_and(|s| s == "RELEASED")
        }
        (c, "ChargePayment") if c == consumers::PAYMENT.name => {
            ground.payments.get(&(order, "charge".into())).copied().unwrap_or(false)
        }
        (c, "RefundPayment") if c == consumers::PAYMENT.name => {
            ground.payments.get(&(order, "refund".into())).copied().unwrap_or(false)
        }
        _ => return None,
    })
}

/// The four checks over `log` and `ground`.
pub(super) fn check(log: &Log, ground: &Ground) -> Findings {
    let mut f = Findings::default();
    let empty = BTreeSet::new();
    // Per consumer and order: the event ids of each type its inbox holds.
    let mut recorded: BTreeMap<(&str, Uuid, &str), bool> = BTreeMap::new();
    for (event_id, event) in log.events() {
        let Some(consumer) = consumers::ALL.iter().find(|c| c.topic == event.topic) else {
            continue;
        };
        let inbox = ground.inbox.get(consumer.name).unwrap_or(&empty);
        let held = inbox.contains(event_id);
        let any = recorded
            .entry((consumer.name, event.order_id, event.event_type.as_str()))
            .or_default();
        *any |= held;
        if !held {
            f.never_handled.push(format!(
                "{} {event_id} of order {} on {}: in the log, not in {}'s inbox",
                event.event_type, event.order_id, event.topic, consumer.name
            ));
        } else if has_effect(consumer, *event_id, event, ground) == Some(false) {
            f.handled_without_effect.push(format!(
                "{} {event_id} of order {}: in {}'s inbox, its effect absent",
                event.event_type, event.order_id, consumer.name
            ));
        }
    }
    let saga = ground.inbox.get(consumers::ORDER_SAGA.name).unwrap_or(&empty);
    for event_id in ground.transitions.difference(saga) {
        f.effect_without_inbox.push(format!(
            "a saga transition by reply {event_id} with no inbox row for it"
        ));
    }
    let held = |consumer: &str, order: Uuid, event_type: &str| {
        recorded.get(&(consumer, order, event_type)).copied().unwrap_or(false)
    };
    for order in ground.reservations.keys() {
        if !held(consumers::INVENTORY.name, *order, "ReserveStock") {
            f.effect_without_inbox.push(format!(
                "order {order}'s reservation, with no ReserveStock of it in the inventory's inbox"
            ));
        }
    }
    for (order, kind) in ground.payments.keys() {
        let command = if kind == "charge" {
            "ChargePayment"
        } else {
            "RefundPayment"
        };
        if !held(consumers::PAYMENT.name, *order, command) {
            f.effect_without_inbox.push(format!(
                "order {order}'s {kind}, with no {command} of it in the payment inbox"
            ));
        }
    }
    for (consumer, ids) in &ground.sourceless {
        for id in ids {
            f.inbox_without_source
                .push(format!("{consumer}'s inbox row {id} names no copy in the log"));
        }
    }
    f
}

/// Reads [`Ground`] from the stack's databases.
pub(super) async fn ground(stack: &Stack) -> anyhow::Result<Ground> {
    let mut g = Ground::default();
    for (db, consumer) in [
        ("orders", consumers::ORDER_SAGA.name),
        ("inventory", consumers::INVENTORY.name),
        ("payments", consumers::PAYMENT.name),
    ] {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await?;
        let rows: Vec<(Uuid, bool)> =
            sqlx::query_as("SELECT event_id, source_offset IS NULL FROM inbox WHERE consumer = $1")
                .bind(consumer)
                .fetch_all(&mut c)
                .await?;
        g.sourceless
            .insert(consumer, rows.iter().filter(|r| r.1).map(|r| r.0).collect());
        g.inbox.insert(consumer, rows.into_iter().map(|r| r.0).collect());
        match db {
            "orders" => {
                g.transitions = sqlx::query_scalar(
                    "SELECT DISTINCT event_id FROM order_history WHERE event_id IS NOT NULL AND cause = ANY($1)",
                )
                .bind(&REPLIES[..])
                .fetch_all(&mut c)
                .await?
                .into_iter()
                .collect();
            }
            "inventory" => {
                g.reservations = sqlx::query_as("SELECT order_id, status FROM reservations")
                    .fetch_all(&mut c)
                    .await?
                    .into_iter()
                    .collect();
            }
            _ => {
                g.payments = sqlx::query_as::<_, (Uuid, String, bool)>(
                    "SELECT order_id, kind, status <> 'PENDING' AND reconciled_at IS NULL FROM payments",
                )
                .fetch_all(&mut c)
                .await?
                .into_iter()
                .map(|(o, k, settled)| ((o, k), settled))
                .collect();
            }
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use contract::{Envelope, Message};
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;

    use super::*;

    fn copy(topic: &str, envelope: &Envelope, offset: i64) -> OwnedMessage {
        let headers = kafka::headers(&envelope.event_id.to_string(), &envelope.event_type, None);
        OwnedMessage::new(
            Some(envelope.to_bytes()),
            Some(envelope.order_id.to_string().into_bytes()),
            topic.into(),
            Timestamp::LogAppendTime(offset),
            0,
            offset,
            Some(headers),
        )
    }

    /// One order's reserve command and reply in the log; `ground` as a
    /// healthy run leaves it.
    fn healthy() -> (Log, Ground, Envelope, Envelope) {
        let order = Uuid::new_v4();
        let reserve = Envelope::new(
            order,
            &Message::ReserveStock {
                sku: "WIDGET".into(),
                quantity: 1,
            },
            None,
        );
        let reserved = Envelope::new(order, &Message::StockReserved, Some(&reserve));
        let mut log = Log::default();
        log.add(
            contract::topics::INVENTORY_COMMANDS,
            &[copy("inventory.commands", &reserve, 1)],
        );
        log.add(contract::topics::ORDER_EVENTS, &[copy("order.events", &reserved, 1)]);
        let mut g = Ground::default();
        g.inbox.insert(consumers::INVENTORY.name, [reserve.event_id].into());
        g.inbox.insert(consumers::ORDER_SAGA.name, [reserved.event_id].into());
        g.reservations.insert(order, "RESERVED".into());
        g.transitions.insert(reserved.event_id);
        (log, g, reserve, reserved)
    }

    #[test]
    fn a_healthy_run_finds_nothing_and_each_removal_finds_its_own() {
        let (log, g, reserve, reserved) = healthy();
        let f = check(&log, &g);
        assert!(
            f.never_handled.is_empty()
                && f.handled_without_effect.is_empty()
                && f.effect_without_inbox.is_empty()
                && f.inbox_without_source.is_empty(),
            "{f:?}"
        );
        // Offsets before handling: the event acknowledged, never handled.
        let mut lost = g.clone();
        lost.inbox.insert(consumers::INVENTORY.name, BTreeSet::new());
        lost.reservations.clear();
        let f = check(&log, &lost);
        assert_eq!(f.never_handled.len(), 1, "{f:?}");
        assert!(f.handled_without_effect.is_empty() && f.effect_without_inbox.is_empty());
        // The inbox committed apart: the row kept, the transition lost.
        let mut apart = g.clone();
        apart.transitions.clear();
        let f = check(&log, &apart);
        assert_eq!(f.handled_without_effect.len(), 1, "{f:?}");
        assert!(f.handled_without_effect[0].contains(&reserved.event_id.to_string()));
        // The inbox off: the reservation made, no row for its command.
        let mut off = g.clone();
        off.inbox.insert(consumers::INVENTORY.name, BTreeSet::new());
        let f = check(&log, &off);
        assert_eq!(f.effect_without_inbox.len(), 1, "{f:?}");
        assert_eq!(f.never_handled.len(), 1, "{f:?}");
        // An inbox row with no source.
        let mut sourceless = g.clone();
        sourceless
            .sourceless
            .insert(consumers::INVENTORY.name, vec![reserve.event_id]);
        assert_eq!(check(&log, &sourceless).inbox_without_source.len(), 1);
    }
}
