//! The saga's messages: commands from the order orchestrator to the
//! participants, and their replies back to it.

use serde::{Deserialize, Serialize};

use crate::topics::{INVENTORY_COMMANDS, ORDER_EVENTS, PAYMENT_COMMANDS};
use crate::{Error, Result};

/// A saga message, tagged by `event_type` with its fields in `payload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "event_type", content = "payload")]
pub enum Message {
    /// Reserve `quantity` units of `sku` for the order.
    ReserveStock {
        /// Stock keeping unit.
        sku: String,
        /// Units to reserve (> 0).
        quantity: i32,
    },
    /// Give the order's reservation back.
    ReleaseStock,
    /// The reservation succeeded.
    StockReserved,
    /// Not enough stock; nothing was reserved.
    StockRejected {
        /// Why.
        reason: String,
    },
    /// The reservation was given back.
    StockReleased,
    /// Charge the order's amount.
    ChargePayment {
        /// Amount in cents (> 0).
        amount_cents: i64,
        /// Card token sent to the gateway.
        card: String,
    },
    /// Refund the order's captured charge.
    RefundPayment {
        /// Amount in cents.
        amount_cents: i64,
        /// 1 for the saga's refund; an operator's retry after a failed refund
        /// counts up (each attempt is its own gateway operation). Absent = 1.
        #[serde(default = "first_attempt")]
        attempt: u32,
    },
    /// The gateway captured the charge.
    PaymentCaptured {
        /// The gateway's charge id.
        charge_id: String,
    },
    /// The gateway declined the charge.
    PaymentDeclined {
        /// The gateway's reason.
        reason: String,
    },
    /// The gateway refunded the charge.
    PaymentRefunded {
        /// The gateway's refund id.
        refund_id: String,
    },
    /// The gateway refused the refund for good: the order needs a person.
    RefundFailed {
        /// The gateway's reason.
        reason: String,
    },
}

fn first_attempt() -> u32 {
    1
}

/// Which payment operation a command asks for (stored as `charge` /
/// `refund`, and the first word of its gateway key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "sqlx",
    derive(sqlx::Type),
    sqlx(type_name = "text", rename_all = "lowercase")
)]
pub enum PaymentKind {
    /// Take the order's amount (`ChargePayment`).
    Charge,
    /// Give a captured charge back (`RefundPayment`).
    Refund,
}

impl PaymentKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }
}

/// One payment operation: an order's charge, or one attempt at its refund.
/// Every delivery of every command for it — and every reconciliation that
/// asks the gateway about it — names the same operation, so the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PaymentOperation {
    /// The order.
    pub order_id: uuid::Uuid,
    /// Charge or refund.
    pub kind: PaymentKind,
    /// 1 for the saga's own; an operator's retry of a failed refund is the next.
    pub attempt: u32,
}

impl PaymentOperation {
    /// The operation a payment command about `order_id` asks for (`None`
    /// for any other message).
    pub fn of_command(order_id: uuid::Uuid, message: &Message) -> Option<Self> {
        let (kind, attempt) = match message {
            Message::ChargePayment { .. } => (PaymentKind::Charge, 1),
            Message::RefundPayment { attempt, .. } => (PaymentKind::Refund, (*attempt).max(1)),
            _ => return None,
        };
        Some(Self {
            order_id,
            kind,
            attempt,
        })
    }

    /// The gateway's Idempotency-Key of this operation: derived from the
    /// operation (the order, the kind, the attempt), never from a message.
    /// Attempt 1 has no suffix: `charge-<order>`, `refund-<order>-2`.
    pub fn gateway_key(&self) -> String {
        let (kind, order_id) = (self.kind.as_str(), self.order_id);
        match self.attempt {
            0 | 1 => format!("{kind}-{order_id}"),
            n => format!("{kind}-{order_id}-{n}"),
        }
    }
}

impl Message {
    /// The topic this message is published to.
    pub fn topic(&self) -> &'static str {
        match self {
            Self::ReserveStock { .. } | Self::ReleaseStock => INVENTORY_COMMANDS,
            Self::ChargePayment { .. } | Self::RefundPayment { .. } => PAYMENT_COMMANDS,
            Self::StockReserved
            | Self::StockRejected { .. }
            | Self::StockReleased
            | Self::PaymentCaptured { .. }
            | Self::PaymentDeclined { .. }
            | Self::PaymentRefunded { .. }
            | Self::RefundFailed { .. } => ORDER_EVENTS,
        }
    }

    /// Splits into the envelope's `event_type` and `payload`.
    pub fn to_parts(&self) -> (String, serde_json::Value) {
        let mut value = serde_json::to_value(self).expect("message serialises");
        let payload = value
            .get_mut("payload")
            .map(serde_json::Value::take)
            .unwrap_or(serde_json::Value::Null);
        let event_type = value["event_type"].as_str().expect("tagged").to_owned();
        (event_type, payload)
    }

    /// Rebuilds a message from an envelope's `event_type` and `payload`.
    pub fn from_parts(event_type: &str, payload: serde_json::Value) -> Result<Self> {
        let mut tagged = serde_json::Map::new();
        tagged.insert("event_type".into(), event_type.into());
        if !payload.is_null() {
            tagged.insert("payload".into(), payload);
        }
        serde_json::from_value(serde_json::Value::Object(tagged))
            .map_err(|e| Error::Decode(format!("{event_type}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_and_struct_variants_round_trip() {
        for m in [
            Message::ReleaseStock,
            Message::ChargePayment {
                amount_cents: 10,
                card: "4242".into(),
            },
        ] {
            let (t, p) = m.to_parts();
            assert_eq!(Message::from_parts(&t, p).unwrap(), m);
        }
    }

    #[test]
    fn a_refund_without_an_attempt_is_the_first() {
        let m = Message::from_parts("RefundPayment", serde_json::json!({"amount_cents": 5})).unwrap();
        assert_eq!(
            m,
            Message::RefundPayment {
                amount_cents: 5,
                attempt: 1
            }
        );
    }

    #[test]
    fn payment_keys_name_the_operation_and_retries_get_their_own() {
        let id = uuid::Uuid::nil();
        let charge = PaymentOperation::of_command(
            id,
            &Message::ChargePayment {
                amount_cents: 1,
                card: "tok".into(),
            },
        )
        .unwrap();
        assert_eq!(charge.gateway_key(), format!("charge-{id}"));
        let refund = |attempt| Message::RefundPayment {
            amount_cents: 1,
            attempt,
        };
        let second = PaymentOperation::of_command(id, &refund(2)).unwrap();
        assert_eq!(second.gateway_key(), format!("refund-{id}-2"));
        let first = PaymentOperation::of_command(id, &refund(0)).unwrap();
        assert_eq!((first.attempt, first.gateway_key()), (1, format!("refund-{id}")));
        assert_eq!(PaymentOperation::of_command(id, &Message::ReleaseStock), None);
    }

    #[test]
    fn unknown_type_and_bad_payload_are_errors() {
        assert!(Message::from_parts("Nope", serde_json::Value::Null).is_err());
        let bad = serde_json::json!({"sku": 1});
        assert!(Message::from_parts("ReserveStock", bad).is_err());
    }
}
