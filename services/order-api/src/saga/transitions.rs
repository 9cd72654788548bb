//! The saga's state machine in one place: a pure function from (order,
//! message) to the next status and the commands to send.
//!
//! ```text
//! PENDING ──StockReserved──► AWAITING_PAYMENT (+ChargePayment)
//! PENDING ──StockRejected──► CANCELLED (out_of_stock)
//! AWAITING_PAYMENT ──PaymentCaptured──► CONFIRMED
//! AWAITING_PAYMENT ──PaymentDeclined──► CANCELLING (+ReleaseStock)
//! CONFIRMED ──CancelRequested──► REFUNDING (+RefundPayment)
//! REFUNDING ──PaymentRefunded──► CANCELLING (+ReleaseStock)
//! CANCELLING ──StockReleased──► CANCELLED
//! ```
//! Anything else is ignored: never applied twice, never applied backwards.

use contract::Message;

use crate::orders::{Order, Status};

/// What a message does to an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Move to `to`, send `emit`, record `cancel_reason` if any.
    Apply {
        /// Next status.
        to: Status,
        /// Commands to send (through the outbox).
        emit: Vec<Message>,
        /// Reason stored on the order when cancelling.
        cancel_reason: Option<&'static str>,
    },
    /// Not legal now.
    Ignore,
}

/// What drives the saga: a participant's reply, or the customer's cancel.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// A reply consumed from `order.events`.
    Reply(&'a Message),
    /// `POST /orders/{id}/cancel`.
    CancelRequested,
}

impl Input<'_> {
    /// Name recorded in the history (the event type, or the HTTP action).
    pub fn name(&self) -> String {
        match self {
            Input::Reply(m) => m.to_parts().0,
            Input::CancelRequested => "CancelRequested".into(),
        }
    }
}

/// Decides the transition for `input` in `order`'s current state.
pub fn decide(order: &Order, input: Input<'_>) -> Decision {
    use Status::*;
    let apply = |to, emit, cancel_reason| Decision::Apply {
        to,
        emit,
        cancel_reason,
    };
    let message = match input {
        Input::CancelRequested if order.status == Confirmed => {
            return apply(
                Refunding,
                vec![Message::RefundPayment {
                    amount_cents: order.amount_cents,
                }],
                Some("customer_cancelled"),
            )
        }
        Input::CancelRequested => return Decision::Ignore,
        Input::Reply(m) => m,
    };
    match (order.status, message) {
        (Pending, Message::StockReserved) => apply(
            AwaitingPayment,
            vec![Message::ChargePayment {
                amount_cents: order.amount_cents,
                card: order.card.clone(),
            }],
            None,
        ),
        (Pending, Message::StockRejected { .. }) => apply(Cancelled, vec![], Some("out_of_stock")),
        (AwaitingPayment, Message::PaymentCaptured { .. }) => apply(Confirmed, vec![], None),
        (AwaitingPayment, Message::PaymentDeclined { .. }) => {
            apply(Cancelling, vec![Message::ReleaseStock], Some("payment_declined"))
        }
        (Refunding, Message::PaymentRefunded { .. }) => apply(Cancelling, vec![Message::ReleaseStock], None),
        (Cancelling, Message::StockReleased) => apply(Cancelled, vec![], None),
        _ => Decision::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn order(status: Status) -> Order {
        Order {
            id: Uuid::new_v4(),
            client_id: "c".into(),
            sku: "A".into(),
            quantity: 1,
            amount_cents: 500,
            card: "4242424242424242".into(),
            status,
            cancel_reason: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    #[test]
    fn happy_path() {
        let d = decide(&order(Status::Pending), Input::Reply(&Message::StockReserved));
        assert!(
            matches!(d, Decision::Apply { to: Status::AwaitingPayment, ref emit, .. }
            if emit == &vec![Message::ChargePayment { amount_cents: 500, card: "4242424242424242".into() }])
        );
        let d = decide(
            &order(Status::AwaitingPayment),
            Input::Reply(&Message::PaymentCaptured { charge_id: "x".into() }),
        );
        assert!(matches!(
            d,
            Decision::Apply {
                to: Status::Confirmed,
                ..
            }
        ));
    }

    #[test]
    fn replies_are_never_applied_twice_or_backwards() {
        // A second StockReserved (new event id) after the first moved the order on.
        for st in [Status::AwaitingPayment, Status::Confirmed, Status::Cancelled] {
            assert_eq!(
                decide(&order(st), Input::Reply(&Message::StockReserved)),
                Decision::Ignore
            );
        }
        assert_eq!(
            decide(
                &order(Status::Confirmed),
                Input::Reply(&Message::PaymentDeclined { reason: "x".into() })
            ),
            Decision::Ignore
        );
        assert_eq!(
            decide(
                &order(Status::Cancelled),
                Input::Reply(&Message::PaymentCaptured { charge_id: "x".into() })
            ),
            Decision::Ignore
        );
        assert_eq!(
            decide(&order(Status::Pending), Input::CancelRequested),
            Decision::Ignore
        );
    }

    #[test]
    fn cancel_of_confirmed_refunds_then_releases() {
        let d = decide(&order(Status::Confirmed), Input::CancelRequested);
        assert!(matches!(d, Decision::Apply { to: Status::Refunding, ref emit, .. }
            if emit == &vec![Message::RefundPayment { amount_cents: 500 }]));
        let d = decide(
            &order(Status::Refunding),
            Input::Reply(&Message::PaymentRefunded { refund_id: "r".into() }),
        );
        assert!(
            matches!(d, Decision::Apply { to: Status::Cancelling, ref emit, .. } if emit == &vec![Message::ReleaseStock])
        );
        let d = decide(&order(Status::Cancelling), Input::Reply(&Message::StockReleased));
        assert!(matches!(
            d,
            Decision::Apply {
                to: Status::Cancelled,
                ..
            }
        ));
    }
}
