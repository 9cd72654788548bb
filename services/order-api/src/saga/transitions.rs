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
//! REFUNDING ──RefundFailed──► MANUAL_REVIEW
//! MANUAL_REVIEW ──RetryRefund (operator)──► REFUNDING (+RefundPayment, next attempt)
//! any open state ──DeadlineExceeded (re-sends exhausted)──► MANUAL_REVIEW
//! ```
//! A reconciled answer (the gateway's record, taken when the participant's
//! reply is overdue) moves the order exactly as that reply would. Anything
//! else is ignored: never applied twice, never applied backwards.

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
    /// The gateway's record of an overdue payment operation, as the reply
    /// payment-service would have sent.
    Reconciled(&'a Message),
    /// The state stayed overdue after every re-send of its command.
    DeadlineExceeded,
    /// An operator retries a refund the gateway refused.
    RetryRefund,
}

impl Input<'_> {
    /// Name recorded in the history (the event type, or the HTTP action).
    pub fn name(&self) -> String {
        match self {
            Input::Reply(m) => m.to_parts().0,
            Input::CancelRequested => "CancelRequested".into(),
            Input::Reconciled(m) => format!("Reconciled:{}", m.to_parts().0),
            Input::DeadlineExceeded => "DeadlineExceeded".into(),
            Input::RetryRefund => "RetryRefund".into(),
        }
    }
}

/// The command an order in open state `state` waits on, built from the
/// order: what a transition into `state` sends, and what a deadline re-sends.
/// `None` for a state that waits on nothing.
pub fn command(order: &Order, state: Status) -> Option<Message> {
    Some(match state {
        Status::Pending => Message::ReserveStock {
            sku: order.sku.clone(),
            quantity: order.quantity,
        },
        Status::AwaitingPayment => Message::ChargePayment {
            amount_cents: order.amount_cents,
            card: order.card_token.clone().unwrap_or_default(),
        },
        Status::Refunding => Message::RefundPayment {
            amount_cents: order.amount_cents,
            attempt: order.refund_attempt.max(1) as u32,
        },
        Status::Cancelling => Message::ReleaseStock,
        _ => return None,
    })
}

/// Decides the transition for `input` in `order`'s current state.
pub fn decide(order: &Order, input: Input<'_>) -> Decision {
    use Status::*;
    let apply = |to, emit, cancel_reason| Decision::Apply {
        to,
        emit,
        cancel_reason,
    };
    let refund = || command(order, Refunding).expect("refunding waits on a command");
    let message = match input {
        Input::CancelRequested if order.status == Confirmed => {
            return apply(Refunding, vec![refund()], Some("customer_cancelled"))
        }
        Input::CancelRequested => return Decision::Ignore,
        Input::DeadlineExceeded if Status::OPEN.contains(&order.status) => {
            return apply(ManualReview, vec![], Some("deadline_exceeded"))
        }
        Input::DeadlineExceeded => return Decision::Ignore,
        Input::RetryRefund
            if order.status == ManualReview && order.cancel_reason.as_deref() == Some("refund_failed") =>
        {
            // The refund is a customer's cancel, retried.
            return apply(Refunding, vec![refund()], Some("customer_cancelled"));
        }
        Input::RetryRefund => return Decision::Ignore,
        Input::Reply(m) | Input::Reconciled(m) => m,
    };
    match (order.status, message) {
        (Pending, Message::StockReserved) => apply(
            AwaitingPayment,
            vec![command(order, AwaitingPayment).expect("awaiting payment waits on a command")],
            None,
        ),
        (Pending, Message::StockRejected { .. }) => apply(Cancelled, vec![], Some("out_of_stock")),
        (AwaitingPayment, Message::PaymentCaptured { .. }) => apply(Confirmed, vec![], None),
        (AwaitingPayment, Message::PaymentDeclined { .. }) => {
            apply(Cancelling, vec![Message::ReleaseStock], Some("payment_declined"))
        }
        (Refunding, Message::PaymentRefunded { .. }) => apply(Cancelling, vec![Message::ReleaseStock], None),
        (Refunding, Message::RefundFailed { .. }) => apply(ManualReview, vec![], Some("refund_failed")),
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
            card_token: Some("tok_test".into()),
            card_last4: Some("4242".into()),
            status,
            cancel_reason: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            last_command_id: None,
            reconcile_attempts: 0,
            refund_attempt: 1,
            reconciled_at: None,
        }
    }

    #[test]
    fn happy_path() {
        let d = decide(&order(Status::Pending), Input::Reply(&Message::StockReserved));
        assert!(
            matches!(d, Decision::Apply { to: Status::AwaitingPayment, ref emit, .. }
            if emit == &vec![Message::ChargePayment { amount_cents: 500, card: "tok_test".into() }])
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
            if emit == &vec![Message::RefundPayment { amount_cents: 500, attempt: 1 }]));
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

    #[test]
    fn a_refused_refund_goes_to_manual_review_and_only_an_operator_retries_it() {
        let d = decide(
            &order(Status::Refunding),
            Input::Reply(&Message::RefundFailed { reason: "no".into() }),
        );
        assert!(matches!(
            d,
            Decision::Apply {
                to: Status::ManualReview,
                cancel_reason: Some("refund_failed"),
                ..
            }
        ));
        let mut review = order(Status::ManualReview);
        review.cancel_reason = Some("refund_failed".into());
        review.refund_attempt = 2;
        let d = decide(&review, Input::RetryRefund);
        assert!(matches!(d, Decision::Apply { to: Status::Refunding, ref emit, .. }
            if emit == &vec![Message::RefundPayment { amount_cents: 500, attempt: 2 }]));
        // Nothing else leaves manual review, and a deadline never retries a refund.
        review.cancel_reason = Some("deadline_exceeded".into());
        assert_eq!(decide(&review, Input::RetryRefund), Decision::Ignore);
        assert_eq!(
            decide(
                &review,
                Input::Reply(&Message::PaymentRefunded { refund_id: "r".into() })
            ),
            Decision::Ignore
        );
    }

    #[test]
    fn a_reconciled_answer_moves_the_order_as_the_reply_would_and_deadlines_end_open_states_only() {
        let captured = Message::PaymentCaptured { charge_id: "c".into() };
        assert_eq!(
            decide(&order(Status::AwaitingPayment), Input::Reconciled(&captured)),
            decide(&order(Status::AwaitingPayment), Input::Reply(&captured))
        );
        assert_eq!(
            decide(&order(Status::Confirmed), Input::Reconciled(&captured)),
            Decision::Ignore
        );
        for st in Status::OPEN {
            assert!(matches!(
                decide(&order(st), Input::DeadlineExceeded),
                Decision::Apply {
                    to: Status::ManualReview,
                    ..
                }
            ));
        }
        for st in [Status::Confirmed, Status::Cancelled, Status::ManualReview] {
            assert_eq!(decide(&order(st), Input::DeadlineExceeded), Decision::Ignore);
        }
    }
}
