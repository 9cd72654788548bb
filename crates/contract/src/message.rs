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
            | Self::PaymentRefunded { .. } => ORDER_EVENTS,
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
    fn unknown_type_and_bad_payload_are_errors() {
        assert!(Message::from_parts("Nope", serde_json::Value::Null).is_err());
        let bad = serde_json::json!({"sku": 1});
        assert!(Message::from_parts("ReserveStock", bad).is_err());
    }
}
