//! `payments::handle`, the command handler, over a real database and the
//! local gateway: each command's effect at the gateway happens once however
//! often the command arrives — a redelivery stops at the inbox, a republish
//! (same operation, new event id) at the payment per operation — and the
//! payment's status and reply follow the gateway's answer.

use contract::{Envelope, Message};
use kafka::consumer::Handled;
use payment_service::payments;
use uuid::Uuid;

use super::fixture;

fn charge(order: Uuid, token: &str) -> Envelope {
    Envelope::new(
        order,
        &Message::ChargePayment {
            amount_cents: 1500,
            card: token.to_owned(),
        },
        None,
    )
}

/// The same command again under a new event id (a republished fact).
fn republished(command: &Envelope) -> Envelope {
    Envelope::new(command.order_id, &command.message().unwrap(), None)
}

/// Handles `command` republished and checks that it stopped at the payment
/// per operation: no second call reached the gateway (whose key would have
/// answered it with a replay — the in-process gateway counts them).
async fn handle_republished(deps: &payment_service::Deps, command: &Envelope) {
    let replays = || telemetry::metrics::get("http_idempotent_replays_total", &[]);
    let before = replays();
    payments::handle(deps, republished(command)).await.unwrap();
    assert_eq!(
        replays(),
        before,
        "the republished command called the gateway again instead of stopping at the payment"
    );
}

#[tokio::test]
async fn a_charge_is_made_once_however_often_its_command_arrives() {
    let f = fixture().await;
    let order = Uuid::now_v7();
    let command = charge(order, &f.card_token().await);
    assert_eq!(
        payments::handle(&f.deps, command.clone()).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(
        payments::handle(&f.deps, command.clone()).await.unwrap(),
        Handled::Duplicate,
        "a redelivery stops at the inbox"
    );
    handle_republished(&f.deps, &command).await;

    assert_eq!(
        f.ledger(order).await,
        [("charge".to_owned(), "captured".to_owned())],
        "one charge at the gateway"
    );
    let (status, attempts) = f.operation(order, "charge").await;
    assert_eq!(status, "CAPTURED");
    assert_eq!(
        attempts, 2,
        "the republished command reached the payment (and stopped there); the redelivery did not"
    );
    assert_eq!(f.replies(order).await, ["PaymentCaptured"], "one reply");
}

#[tokio::test]
async fn a_declined_card_is_declined_once_and_replied() {
    let f = fixture().await;
    let order = Uuid::now_v7();
    let command = charge(order, &f.token_of(mock_gateway::DECLINED_CARD).await);
    assert_eq!(
        payments::handle(&f.deps, command.clone()).await.unwrap(),
        Handled::Applied
    );
    handle_republished(&f.deps, &command).await;
    assert_eq!(f.ledger(order).await, [("charge".to_owned(), "declined".to_owned())]);
    assert_eq!(f.operation(order, "charge").await.0, "DECLINED");
    assert_eq!(f.replies(order).await, ["PaymentDeclined"]);
}

#[tokio::test]
async fn a_refund_after_a_capture_is_made_once() {
    let f = fixture().await;
    let order = Uuid::now_v7();
    payments::handle(&f.deps, charge(order, &f.card_token().await))
        .await
        .unwrap();
    let refund = Envelope::new(
        order,
        &Message::RefundPayment {
            amount_cents: 1500,
            attempt: 1,
        },
        None,
    );
    assert_eq!(
        payments::handle(&f.deps, refund.clone()).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(
        payments::handle(&f.deps, refund.clone()).await.unwrap(),
        Handled::Duplicate
    );
    handle_republished(&f.deps, &refund).await;

    assert_eq!(
        f.ledger(order).await,
        [
            ("charge".to_owned(), "captured".to_owned()),
            ("refund".to_owned(), "refunded".to_owned())
        ],
        "one charge and one refund at the gateway"
    );
    assert_eq!(f.operation(order, "refund").await.0, "REFUNDED");
    assert_eq!(f.replies(order).await, ["PaymentCaptured", "PaymentRefunded"]);
}
