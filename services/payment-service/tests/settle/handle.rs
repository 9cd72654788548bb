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

/// A fixture, an order and its charge command, handled once (applied).
async fn charged() -> (super::Fixture, Uuid, Envelope) {
    let f = fixture().await;
    let order = Uuid::now_v7();
    let command = charge(order, &f.card_token().await);
    assert_eq!(
        payments::handle(&f.deps, command.clone()).await.unwrap(),
        Handled::Applied
    );
    (f, order, command)
}

#[tokio::test]
async fn a_charge_is_made_once_however_often_its_command_arrives() {
    let (f, order, command) = charged().await;
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

fn traced(envelope: &Envelope) -> kafka::consumer::Traced<Envelope> {
    kafka::consumer::Traced {
        message: envelope.clone(),
        span: tracing::Span::none(),
        position: None,
        producer: None,
        header_event_id: None,
    }
}

#[tokio::test]
async fn a_batch_charges_each_order_once_with_its_repeats_and_redeliveries_inside_it() {
    let f = fixture().await;
    let orders: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    let token = f.card_token().await;
    let commands: Vec<Envelope> = orders.iter().map(|o| charge(*o, &token)).collect();
    // Handled before: the first order's command, redelivered in the batch.
    payments::handle(&f.deps, commands[0].clone()).await.unwrap();
    let again = republished(&commands[1]);
    let batch = vec![
        traced(&commands[0]), // redelivered: stops at the inbox
        traced(&commands[1]),
        traced(&commands[2]),
        traced(&commands[1]), // the same event twice in one batch
        traced(&again),       // the same operation under a new event id
        traced(&commands[3]),
        traced(&commands[4]),
    ];
    let replays = || telemetry::metrics::get("http_idempotent_replays_total", &[]);
    let before = replays();
    let handled = payments::handle_batch(&f.deps, batch).await.unwrap();
    assert_eq!(
        replays(),
        before,
        "an operation repeated in the batch called the gateway again"
    );
    use Handled::{Applied, Duplicate};
    assert_eq!(
        handled,
        [Duplicate, Applied, Applied, Duplicate, Applied, Applied, Applied]
    );
    for order in &orders {
        assert_eq!(
            f.ledger(*order).await,
            [("charge".to_owned(), "captured".to_owned())],
            "one charge at the gateway for {order}"
        );
        assert_eq!(f.replies(*order).await, ["PaymentCaptured"], "one reply for {order}");
        assert_eq!(f.operation(*order, "charge").await.0, "CAPTURED");
    }
    // The batch's commands are upserted a statement at a time, split where
    // an operation repeats: the second order's three commands (its event,
    // that event again, a new event) each counted an attempt, in order.
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM payments WHERE order_id = $1 AND kind = 'charge'")
        .bind(orders[1])
        .fetch_one(&f.deps.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 3, "each command for the operation counted once");
    let misses: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_misses WHERE event_id = $1")
        .bind(again.event_id)
        .fetch_one(&f.deps.pool)
        .await
        .unwrap();
    assert_eq!(
        misses, 1,
        "the repeat under a new event id is a miss the payment caught"
    );
    for redelivered in [&commands[0], &commands[1]] {
        let counted: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(redeliveries), 0)::bigint FROM inbox_redeliveries WHERE event_id = $1",
        )
        .bind(redelivered.event_id)
        .fetch_one(&f.deps.pool)
        .await
        .unwrap();
        assert_eq!(counted, 1, "each redelivery counted once");
    }
}

#[tokio::test]
async fn a_batch_that_fails_at_the_gateway_commits_nothing_and_its_retry_charges_once() {
    let f = fixture().await;
    let orders: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    let token = f.card_token().await;
    let batch: Vec<_> = orders.iter().map(|o| traced(&charge(*o, &token))).collect();
    // The gateway unreachable: a client whose every call fails.
    let down = payment_service::Deps {
        pool: f.deps.pool.clone(),
        gateway: payment_service::gateway::Client::new(
            "http://127.0.0.1:9",
            f.gateway.payment_key.expose(),
            std::time::Duration::from_millis(200),
        )
        .unwrap(),
    };
    let e = payments::handle_batch(&down, batch.clone()).await.unwrap_err();
    // A dependency down: retried for as long as it takes, never dead-lettered.
    assert!(matches!(e, kafka::consumer::HandleError::Unavailable(_)), "{e}");
    for order in &orders {
        assert!(f.replies(*order).await.is_empty(), "nothing replied for {order}");
        assert_eq!(f.operation(*order, "charge").await.0, "PENDING", "left PENDING");
    }
    let handled = payments::handle_batch(&f.deps, batch).await.unwrap();
    assert_eq!(handled, [Handled::Applied; 3]);
    for order in &orders {
        assert_eq!(f.ledger(*order).await, [("charge".to_owned(), "captured".to_owned())]);
        assert_eq!(f.replies(*order).await, ["PaymentCaptured"]);
    }
}

/// The backstop past every window: the command comes again after its
/// inbox row was purged (past `INBOX_RETENTION_SECS`) and the gateway's
/// key expired (past `GATEWAY_KEY_TTL_SECS`) — both layers have forgotten
/// it — and it still charges nothing, because the payment row of the
/// operation is kept for as long as the order (no purge deletes
/// `payments`). Checked against the removal: with the payment row deleted
/// too, the repeat reaches the gateway and the ledger holds two captures.
#[tokio::test]
async fn a_command_past_every_window_is_stopped_by_the_kept_payment_row() {
    let (f, order, command) = charged().await;
    // Both windows pass: the inbox forgets the event, the gateway its key.
    sqlx::query("DELETE FROM inbox").execute(&f.deps.pool).await.unwrap();
    let gateway = sqlx::PgPool::connect(f._dbs.1.url()).await.unwrap();
    let forgotten = sqlx::query("DELETE FROM idempotency_keys")
        .execute(&gateway)
        .await
        .unwrap();
    assert!(forgotten.rows_affected() >= 1, "the gateway had the charge's key");
    gateway.close().await;

    payments::handle(&f.deps, command).await.unwrap();
    assert_eq!(
        f.ledger(order).await,
        [("charge".to_owned(), "captured".to_owned())],
        "one charge: the kept payment row stopped the repeat"
    );
}

/// Each command this service consumes, repeated under its event id after
/// its replies were published, gets what `contract::repeats::ON_REPEAT`
/// (docs/contract.md, "What a repeat gets") says: its first replies again,
/// under their first ids, and nothing more at the gateway.
#[tokio::test]
async fn every_command_repeated_gets_what_the_contract_says() {
    use contract::repeats::{OnRepeat, ON_REPEAT};
    let ours: Vec<_> = ON_REPEAT
        .iter()
        .filter(|r| r.consumer == contract::topics::consumers::PAYMENT.name)
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    for r in ours {
        let f = fixture().await;
        let order = Uuid::now_v7();
        let command = match r.event_type {
            "ChargePayment" => charge(order, &f.card_token().await),
            "RefundPayment" => {
                let charged = payments::handle(&f.deps, charge(order, &f.card_token().await)).await;
                assert_eq!(charged.unwrap(), Handled::Applied);
                let refund = Message::RefundPayment {
                    amount_cents: 1500,
                    attempt: 1,
                };
                Envelope::new(order, &refund, None)
            }
            other => panic!("no case for {other}"),
        };
        let replies = || async {
            sqlx::query_scalar::<_, Uuid>("SELECT event_id FROM outbox ORDER BY id")
                .fetch_all(&f.deps.pool)
                .await
                .unwrap()
        };
        let publish = || async {
            // The relay settles a published row by deleting it.
            sqlx::query("DELETE FROM outbox").execute(&f.deps.pool).await.unwrap();
        };
        publish().await;
        assert_eq!(
            payments::handle(&f.deps, command.clone()).await.unwrap(),
            Handled::Applied
        );
        let first = replies().await;
        assert!(!first.is_empty(), "{}: a reply", r.event_type);
        let ledger = f.ledger(order).await;
        publish().await;
        let again = payments::handle(&f.deps, command).await.unwrap();
        assert_eq!(again, Handled::Duplicate, "{}", r.event_type);
        match r.on_repeat {
            OnRepeat::StoredReplies => assert_eq!(replies().await, first, "{}: the first replies again", r.event_type),
            OnRepeat::Nothing => assert!(replies().await.is_empty(), "{}: nothing", r.event_type),
        }
        assert_eq!(
            f.ledger(order).await,
            ledger,
            "{}: nothing more at the gateway",
            r.event_type
        );
    }
}
