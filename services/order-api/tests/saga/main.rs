//! The order saga's consumer handler against a real PostgreSQL.

use contract::{Envelope, Message};
use kafka::consumer::Handled;
use order_api::orders::{self, NewOrder, Status};
use testkit::TempDb;

/// Scenario 20 — a payment reply redelivered does not credit twice. The
/// same PaymentCaptured (one event id) delivered twice confirms the order
/// once: the second delivery stops at the saga's inbox, and the history has
/// one CONFIRMED step. A *republished* reply (same fact, new event id) gets
/// past the inbox and is stopped by the state machine, which records it as
/// ignored — and as an inbox miss, the evidence the chaos suite counts.
/// Checked against the removal: with the inbox off (`UNSAFE_NO_INBOX`, `switches::Switch::NoInbox`)
/// the second delivery returns `Ignored` and writes an ignored history row
/// and a miss, so the first two assertions fail.
#[tokio::test]
async fn scenario_20_a_redelivered_payment_reply_confirms_the_order_once() {
    let db = TempDb::new("eo_saga");
    let pool = order_api::connect(db.url(), 4).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let order = orders::insert(
        &mut conn,
        "test",
        &NewOrder {
            sku: "WIDGET".into(),
            quantity: 1,
            amount_cents: 500,
            card_token: "tok_test".into(),
            card_last4: "4242".into(),
        },
    )
    .await
    .unwrap();
    drop(conn);
    let reserve = Envelope::new(
        order.id,
        &Message::ReserveStock {
            sku: "WIDGET".into(),
            quantity: 1,
        },
        None,
    );
    let reserved = Envelope::new(order.id, &Message::StockReserved, Some(&reserve));
    assert_eq!(
        order_api::saga::handle(&pool, reserved).await.unwrap(),
        Handled::Applied
    );
    let captured = Envelope::new(
        order.id,
        &Message::PaymentCaptured {
            charge_id: "ch_1".into(),
        },
        Some(&reserve),
    );
    assert_eq!(
        order_api::saga::handle(&pool, captured.clone()).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(
        order_api::saga::handle(&pool, captured.clone()).await.unwrap(),
        Handled::Duplicate,
        "the redelivery stops at the inbox"
    );
    let mut conn = pool.acquire().await.unwrap();
    let misses: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_misses")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(misses, 0, "no business key had to catch it");
    let history = orders::history(&mut conn, order.id).await.unwrap();
    // The insert wrote the first step with the order.
    let placed = &history[0];
    assert_eq!(
        (
            placed.from_status,
            placed.to_status,
            placed.cause.as_str(),
            placed.event_id,
            placed.applied
        ),
        (None, Status::Pending, "OrderPlaced", None, true),
        "{history:?}"
    );
    let confirmed = history
        .iter()
        .filter(|h| h.to_status == Status::Confirmed && h.applied)
        .count();
    assert_eq!(confirmed, 1, "{history:?}");
    assert!(history.iter().all(|h| h.applied), "nothing ignored: {history:?}");
    assert_eq!(
        orders::get(&mut conn, order.id).await.unwrap().unwrap().status,
        Status::Confirmed
    );

    // The same fact under a new event id: past the inbox, stopped by the state machine.
    let republished = Envelope::new(
        order.id,
        &Message::PaymentCaptured {
            charge_id: "ch_1".into(),
        },
        Some(&reserve),
    );
    assert_eq!(
        order_api::saga::handle(&pool, republished).await.unwrap(),
        Handled::Ignored,
        "new to the inbox, nothing applied"
    );
    let history = orders::history(&mut conn, order.id).await.unwrap();
    assert_eq!(
        history
            .iter()
            .filter(|h| h.to_status == Status::Confirmed && h.applied)
            .count(),
        1
    );
    assert_eq!(history.iter().filter(|h| !h.applied).count(), 1, "recorded as ignored");
    let misses: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_misses")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(misses, 1, "and counted as an inbox miss");
    drop(conn);
    pool.close().await;
}

/// History retention keeps the steps of orders still in flight and of
/// recent ones; it deletes only old steps of finished orders.
#[tokio::test]
async fn history_retention_deletes_only_old_steps_of_finished_orders() {
    let db = TempDb::new("eo_hist");
    let pool = order_api::connect(db.url(), 2).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let new = widget();
    let finished = orders::insert(&mut conn, "test", &new).await.unwrap();
    let in_flight = orders::insert(&mut conn, "test", &new).await.unwrap();
    let confirmed = orders::Transition {
        id: finished.id,
        status: Status::Confirmed,
        cancel_reason: None,
        command: None,
    };
    orders::write_batch(&mut conn, &[confirmed], &[], &[]).await.unwrap();
    sqlx::query("UPDATE order_history SET at = now() - interval '100 days'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let window = std::time::Duration::from_secs(90 * 86_400);
    assert_eq!(orders::purge_history(&mut conn, window, 1000).await.unwrap(), 1);
    assert!(orders::history(&mut conn, finished.id).await.unwrap().is_empty());
    assert_eq!(
        orders::history(&mut conn, in_flight.id).await.unwrap().len(),
        1,
        "in flight: kept"
    );
    assert!(
        orders::get(&mut conn, finished.id).await.unwrap().is_some(),
        "the order itself stays"
    );
    drop(conn);
    pool.close().await;
}

/// A batch is decided in order against each order's state as the earlier
/// replies of the same batch left it, and written in one statement per
/// table: two orders' replies interleaved, one order's reserve and capture
/// in the same batch, and a republished capture after it (stopped by the
/// state machine) come out as if handled one at a time (tried: with
/// `Plan::step` not moving the order in memory, a's capture is decided
/// against PENDING and ignored, and this fails).
#[tokio::test]
async fn a_batch_moves_each_order_through_its_replies_in_order() {
    let db = TempDb::new("eo_saga");
    let pool = order_api::connect(db.url(), 4).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let new = NewOrder {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 500,
        card_token: "tok_test".into(),
        card_last4: "4242".into(),
    };
    let (a, b) = (
        orders::insert(&mut conn, "test", &new).await.unwrap(),
        orders::insert(&mut conn, "test", &new).await.unwrap(),
    );
    let captured = |id| Envelope::new(id, &Message::PaymentCaptured { charge_id: "ch".into() }, None);
    let batch = vec![
        Envelope::new(a.id, &Message::StockReserved, None),
        Envelope::new(
            b.id,
            &Message::StockRejected {
                reason: "out_of_stock".into(),
            },
            None,
        ),
        captured(a.id),
        captured(a.id),
    ];
    let traced = batch
        .into_iter()
        .map(|message| kafka::consumer::Traced {
            message,
            span: tracing::Span::none(),
            position: None,
            producer: None,
            header_event_id: None,
        })
        .collect();
    let handled = order_api::saga::handle_batch(&pool, traced).await.unwrap();
    assert_eq!(
        handled,
        [Handled::Applied, Handled::Applied, Handled::Applied, Handled::Ignored],
        "the republished capture is new to the inbox and stopped by the state machine"
    );
    let a_now = orders::get(&mut conn, a.id).await.unwrap().unwrap();
    assert_eq!(a_now.status, Status::Confirmed);
    assert_eq!(a_now.last_command_id, None, "CONFIRMED waits on nothing");
    let b_now = orders::get(&mut conn, b.id).await.unwrap().unwrap();
    assert_eq!(
        (b_now.status, b_now.cancel_reason.as_deref()),
        (Status::Cancelled, Some("out_of_stock"))
    );
    let steps: Vec<_> = orders::history(&mut conn, a.id)
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.from_status, h.to_status, h.applied))
        .collect();
    assert_eq!(
        steps,
        [
            (None, Status::Pending, true),
            (Some(Status::Pending), Status::AwaitingPayment, true),
            (Some(Status::AwaitingPayment), Status::Confirmed, true),
            (Some(Status::Confirmed), Status::Confirmed, false),
        ]
    );
    let charges: Vec<(String, String)> = sqlx::query_as("SELECT event_type, message_key FROM outbox ORDER BY id")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        charges,
        [("ChargePayment".to_string(), a.id.to_string())],
        "one command, for a"
    );
    let misses: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_misses")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(misses, 1, "the second capture, stopped by the state machine");
    drop(conn);
    pool.close().await;
}

/// Each reply the saga consumes, repeated under its event id after it
/// moved the order, gets what `contract::repeats::ON_REPEAT`
/// (docs/contract.md, "What a repeat gets") says: nothing — no
/// transition, no history step, no command.
#[tokio::test]
async fn every_reply_repeated_gets_what_the_contract_says() {
    use contract::repeats::{OnRepeat, ON_REPEAT};
    let ours: Vec<_> = ON_REPEAT
        .iter()
        .filter(|r| r.consumer == contract::topics::consumers::ORDER_SAGA.name)
        .collect();
    assert_eq!(ours.len(), 7, "{ours:?}");
    let db = TempDb::new("eo_saga");
    let pool = order_api::connect(db.url(), 4).await.unwrap();
    for r in ours {
        // The reply, and the state in which it moves an order.
        let (reply, from) = match r.event_type {
            "StockReserved" => (Message::StockReserved, Status::Pending),
            "StockRejected" => (Message::StockRejected { reason: "none".into() }, Status::Pending),
            "StockReleased" => (Message::StockReleased, Status::Cancelling),
            "PaymentCaptured" => (
                Message::PaymentCaptured { charge_id: "ch".into() },
                Status::AwaitingPayment,
            ),
            "PaymentDeclined" => (
                Message::PaymentDeclined { reason: "no".into() },
                Status::AwaitingPayment,
            ),
            "PaymentRefunded" => (Message::PaymentRefunded { refund_id: "re".into() }, Status::Refunding),
            "RefundFailed" => (Message::RefundFailed { reason: "no".into() }, Status::Refunding),
            other => panic!("no case for {other}"),
        };
        let mut conn = pool.acquire().await.unwrap();
        let order = orders::insert(&mut conn, "test", &widget()).await.unwrap();
        sqlx::query("UPDATE orders SET status = $2 WHERE id = $1")
            .bind(order.id)
            .bind(from.as_str())
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query("DELETE FROM outbox").execute(&mut *conn).await.unwrap();
        let envelope = Envelope::new(order.id, &reply, None);
        let handled = order_api::saga::handle(&pool, envelope.clone()).await.unwrap();
        assert_eq!(handled, Handled::Applied, "{} in {from:?}", r.event_type);
        let after = state_of(&mut conn, order.id).await;
        assert_ne!(after.0, from, "{}: the first copy moved the order", r.event_type);
        sqlx::query("DELETE FROM outbox").execute(&mut *conn).await.unwrap();
        let again = order_api::saga::handle(&pool, envelope).await.unwrap();
        assert_eq!(again, Handled::Duplicate, "{}", r.event_type);
        let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        match r.on_repeat {
            OnRepeat::Nothing => assert_eq!(sent, 0, "{}: no message", r.event_type),
            OnRepeat::StoredReplies => panic!("{}: the saga stores no replies", r.event_type),
        }
        let repeated = state_of(&mut conn, order.id).await;
        assert_eq!(repeated, after, "{}: no transition, no step", r.event_type);
    }
    pool.close().await;
}

/// An order's state and the number of its history steps.
async fn state_of(conn: &mut sqlx::PgConnection, id: uuid::Uuid) -> (Status, usize) {
    let status = orders::get(conn, id).await.unwrap().unwrap().status;
    (status, orders::history(conn, id).await.unwrap().len())
}

/// One widget for 500 cents, its card a token.
fn widget() -> NewOrder {
    NewOrder {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 500,
        card_token: "tok_test".into(),
        card_last4: "4242".into(),
    }
}
