//! Who may send what: every message type has one producer, the service
//! whose outbox writes it, and one topic. The relay stamps each record with
//! the producer it read the row from — never what the row says — and sends
//! a source only the (topic, type) pairs listed here; every consumer checks
//! the stamp against the type before it handles a message. A service that
//! writes another's message into its own outbox (a compromised
//! inventory-service forging `PaymentCaptured`) is stopped at the relay,
//! and a record that got past it at the consumer.

use crate::topics::{INVENTORY_COMMANDS, ORDER_EVENTS, PAYMENT_COMMANDS};

/// order-api: the saga's commands.
pub const ORDER_API: &str = "order-api";
/// inventory-service: the stock replies.
pub const INVENTORY: &str = "inventory-service";
/// payment-service: the payment replies.
pub const PAYMENT: &str = "payment-service";

/// Every message type: (type, its topic, its producer).
pub const ROUTES: [(&str, &str, &str); 11] = [
    ("ReserveStock", INVENTORY_COMMANDS, ORDER_API),
    ("ReleaseStock", INVENTORY_COMMANDS, ORDER_API),
    ("ChargePayment", PAYMENT_COMMANDS, ORDER_API),
    ("RefundPayment", PAYMENT_COMMANDS, ORDER_API),
    ("StockReserved", ORDER_EVENTS, INVENTORY),
    ("StockRejected", ORDER_EVENTS, INVENTORY),
    ("StockReleased", ORDER_EVENTS, INVENTORY),
    ("PaymentCaptured", ORDER_EVENTS, PAYMENT),
    ("PaymentDeclined", ORDER_EVENTS, PAYMENT),
    ("PaymentRefunded", ORDER_EVENTS, PAYMENT),
    ("RefundFailed", ORDER_EVENTS, PAYMENT),
];

/// The databases whose outboxes the relay reads, and their services.
pub const DATABASES: [(&str, &str); 3] = [("orders", ORDER_API), ("inventory", INVENTORY), ("payments", PAYMENT)];

/// The producer of messages of `event_type`, if it is a saga message.
pub fn of_type(event_type: &str) -> Option<&'static str> {
    ROUTES.iter().find(|(t, _, _)| *t == event_type).map(|(_, _, p)| *p)
}

/// The service whose outbox lives in `database`: its name, or its name
/// after a prefix and `_` (the test stacks' `<prefix>_orders`).
pub fn of_database(database: &str) -> Option<&'static str> {
    DATABASES
        .iter()
        .find(|(db, _)| database == *db || database.strip_suffix(db).is_some_and(|p| p.ends_with('_')))
        .map(|(_, p)| *p)
}

/// Whether `producer` may send `event_type` on `topic`; why not, if not.
pub fn check(producer: &str, topic: &str, event_type: &str) -> Result<(), String> {
    match ROUTES.iter().find(|(t, _, _)| *t == event_type) {
        None => Err(format!("{event_type} is no message of the saga")),
        Some((_, _, p)) if *p != producer => Err(format!("{producer} may not send {event_type} (only {p} does)")),
        Some((_, to, _)) if *to != topic => Err(format!("{event_type} travels on {to}, not {topic}")),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    /// The table agrees with the messages themselves: every type of
    /// [`Message`] is listed once, on the topic [`Message::topic`] names.
    #[test]
    fn every_message_type_has_one_route_on_its_own_topic() {
        let schemas = crate::schema::message_schemas();
        assert_eq!(schemas.len(), ROUTES.len(), "{:?}", schemas.keys());
        for (event_type, topic, _) in ROUTES {
            assert!(schemas.contains_key(event_type), "{event_type}");
            let sample = Message::from_parts(event_type, sample_payload(event_type)).unwrap();
            assert_eq!(sample.topic(), topic, "{event_type}");
        }
    }

    fn sample_payload(event_type: &str) -> serde_json::Value {
        match event_type {
            "ReserveStock" => serde_json::json!({"sku": "S", "quantity": 1}),
            "ChargePayment" => serde_json::json!({"amount_cents": 1, "card": "tok"}),
            "RefundPayment" => serde_json::json!({"amount_cents": 1}),
            "StockRejected" | "PaymentDeclined" | "RefundFailed" => serde_json::json!({"reason": "r"}),
            "PaymentCaptured" => serde_json::json!({"charge_id": "c"}),
            "PaymentRefunded" => serde_json::json!({"refund_id": "r"}),
            _ => serde_json::Value::Null,
        }
    }

    #[test]
    fn a_service_may_send_only_its_own_messages_on_their_topics() {
        assert_eq!(check(PAYMENT, ORDER_EVENTS, "PaymentCaptured"), Ok(()));
        assert_eq!(check(ORDER_API, PAYMENT_COMMANDS, "ChargePayment"), Ok(()));
        let forged = check(INVENTORY, ORDER_EVENTS, "PaymentCaptured").unwrap_err();
        assert!(
            forged.contains("inventory-service may not send PaymentCaptured"),
            "{forged}"
        );
        assert!(
            check(PAYMENT, PAYMENT_COMMANDS, "PaymentCaptured").is_err(),
            "the wrong topic"
        );
        assert!(
            check(ORDER_API, INVENTORY_COMMANDS, "DropTables").is_err(),
            "no such type"
        );
    }

    #[test]
    fn a_database_names_its_service_with_or_without_a_prefix() {
        assert_eq!(of_database("orders"), Some(ORDER_API));
        assert_eq!(of_database("eo_1a2b_inventory"), Some(INVENTORY));
        assert_eq!(of_database("payments"), Some(PAYMENT));
        assert_eq!(of_database("gateway"), None);
        assert_eq!(of_database("xorders"), None, "a suffix counts after an underscore only");
        assert_eq!(of_type("StockReserved"), Some(INVENTORY));
        assert_eq!(of_type("Nope"), None);
    }
}
