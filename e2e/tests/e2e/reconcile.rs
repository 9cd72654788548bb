//! Deadlines and reconciliation (issue 15): no saga is left behind, and
//! none is charged twice on the way out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use e2e::driver::{new_key, Client, OrderRequest, DECLINED_CARD, GOOD_CARD};
use e2e::stack::Service;
use sqlx::Connection as _;
use uuid::Uuid;

fn widget() -> OrderRequest {
    OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 900,
        card: GOOD_CARD.into(),
    }
}

async fn db(stack: &e2e::Stack, name: &str) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&stack.db_url(name)).await.unwrap()
}

/// (captured charges, refunds) of `order` in the gateway's ledger.
async fn ledger(stack: &e2e::Stack, order: Uuid) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'charge' AND status = 'captured'),
                count(*) FILTER (WHERE kind = 'refund')
         FROM ledger WHERE order_id = $1",
    )
    .bind(order)
    .fetch_one(&mut db(stack, "gateway").await)
    .await
    .unwrap()
}

async fn history(stack: &e2e::Stack, order: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT cause FROM order_history WHERE order_id = $1 ORDER BY id")
        .bind(order)
        .fetch_all(&mut db(stack, "orders").await)
        .await
        .unwrap()
}

/// The orders the deadline reconciler acted on, per action: a run that
/// loses one message on purpose must show exactly that order, nothing else.
async fn rescued(stack: &e2e::Stack) -> BTreeMap<String, BTreeSet<Uuid>> {
    e2e::invariants::rescued(&mut db(stack, "orders").await)
        .await
        .unwrap()
        .per_cause
}

async fn inbox_misses(stack: &e2e::Stack) -> i64 {
    let mut n = 0;
    for name in ["orders", "inventory", "payments"] {
        let (m,): (i64,) = sqlx::query_as("SELECT count(*) FROM inbox_misses")
            .fetch_one(&mut db(stack, name).await)
            .await
            .unwrap();
        n += m;
    }
    n
}

/// Short deadlines on order-api: 2 s per state, a scan every second.
async fn short_deadlines(stack: &mut e2e::Stack) {
    for state in ["PENDING", "AWAITING_PAYMENT", "REFUNDING", "CANCELLING"] {
        stack.set_env(Service::OrderApi, &format!("SAGA_DEADLINE_{state}_SECS"), "2");
    }
    stack.set_env(Service::OrderApi, "RECONCILE_INTERVAL_SECS", "1");
    stack.restart(Service::OrderApi).await.unwrap();
}

/// A ChargePayment that payment-service dead-letters (fault point
/// `payment::dead_letter_command`, once) leaves the order in
/// AWAITING_PAYMENT; past its deadline order-api finds no charge at the
/// gateway and re-sends the command under its first event id; the copy is
/// handled (the inbox never recorded the dead-lettered one) and the order
/// is confirmed, charged once. Checked against the removal: without the
/// reconciler task the order stays AWAITING_PAYMENT and `wait_terminal` fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_charge_is_resent_at_its_deadline_and_the_order_ends_charged_once() {
    let mut stack = crate::stack("deadline-dlq").await;
    short_deadlines(&mut stack).await;
    stack.set_env(
        Service::Payment,
        "FAILPOINTS",
        &format!("{}=1*return", payment_service::payments::DEAD_LETTER_COMMAND),
    );
    stack.restart(Service::Payment).await.unwrap();
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    let (order, status) = client
        .place_and_finish(&widget(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(status, "CONFIRMED");
    let dead = e2e::Stack::metric(&stack.admin_url(Service::Payment), "consumer_dead_lettered_total", &[])
        .await
        .unwrap_or(0.0);
    assert_eq!(dead, 1.0, "the first ChargePayment went to the dead-letter topic");
    let steps = history(&stack, order).await;
    assert!(steps.iter().any(|c| c == "Resent:ChargePayment"), "{steps:?}");
    assert_eq!(
        rescued(&stack).await,
        BTreeMap::from([("Resent:ChargePayment".to_owned(), BTreeSet::from([order]))]),
        "the dead-lettered order, and only it, was rescued"
    );
    assert_eq!(ledger(&stack, order).await, (1, 0), "charged once");
    assert_eq!(inbox_misses(&stack).await, 0);
    stack.shutdown(true).await.unwrap();
}

/// A participant's reply is lost after it was sent (order-api dead-letters
/// it: fault point `order_api::dead_letter_reply`), so the order waits in
/// `waiting`; past its deadline order-api re-sends the command under its
/// first event id; the participant's inbox absorbs the command and answers
/// again with the reply it kept, under the reply's first id; the saga
/// handles that copy and the order ends `expected`. Checked against the
/// removal: without the stored replies sent again (`saga_kit::consumer::begin`
/// re-enqueueing nothing) every re-send is absorbed in silence and the
/// order ends in MANUAL_REVIEW.
async fn a_lost_reply_is_sent_again(name: &str, reply: &str, card: &str, command: &str, expected: &str) {
    let mut stack = crate::stack(name).await;
    short_deadlines(&mut stack).await;
    let point = order_api::saga::DEAD_LETTER_REPLY;
    stack.set_env(Service::OrderApi, "FAILPOINTS", &format!("{point}=return({reply})"));
    stack.restart(Service::OrderApi).await.unwrap();
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    let order = client
        .place_order(
            &new_key(),
            &OrderRequest {
                card: card.into(),
                ..widget()
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    // Where it ends: CONFIRMED or CANCELLED, or MANUAL_REVIEW once every
    // re-send was absorbed in silence.
    let end = Instant::now() + Duration::from_secs(90);
    let status = loop {
        let status = client.order(order.id).await.map(|o| o.status).unwrap_or_default();
        if ["CONFIRMED", "CANCELLED", "MANUAL_REVIEW"].contains(&status.as_str()) || Instant::now() > end {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, expected, "{:?}", history(&stack, order.id).await);
    let dead = e2e::Stack::metric(&stack.admin_url(Service::OrderApi), "consumer_dead_lettered_total", &[])
        .await
        .unwrap_or(0.0);
    assert_eq!(dead, 1.0, "the first {reply} went to the dead-letter topic");
    let again = e2e::Stack::metric(
        &stack.admin_url(Service::Inventory),
        "consumer_replies_sent_again_total",
        &[],
    )
    .await
    .unwrap_or(0.0);
    assert!(
        again >= 1.0,
        "inventory answered the re-sent {command} with its kept reply ({again})"
    );
    assert_eq!(
        rescued(&stack).await,
        BTreeMap::from([(format!("Resent:{command}"), BTreeSet::from([order.id]))]),
        "the order whose reply was lost, and only it, was rescued by the re-send"
    );
    let (status, available): (String, i32) = sqlx::query_as(
        "SELECT r.status, s.available FROM reservations r JOIN stock s USING (sku) WHERE r.order_id = $1",
    )
    .bind(order.id)
    .fetch_one(&mut db(&stack, "inventory").await)
    .await
    .unwrap();
    let (held, left) = if expected == "CONFIRMED" {
        ("RESERVED", 9)
    } else {
        ("RELEASED", 10)
    };
    assert_eq!(
        (status.as_str(), available),
        (held, left),
        "reserved once (and released once when cancelled)"
    );
    assert_eq!(inbox_misses(&stack).await, 0);
    stack.shutdown(true).await.unwrap();
}

/// Seed 001's lost reply: StockReserved dead-lettered at order-api; the
/// re-sent ReserveStock is answered with the same StockReserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stock_reserved_is_sent_again_for_the_resent_command_and_the_order_is_confirmed() {
    a_lost_reply_is_sent_again("lost-reserved", "StockReserved", GOOD_CARD, "ReserveStock", "CONFIRMED").await;
}

/// The same in CANCELLING: a declined card, the StockReleased lost; the
/// re-sent ReleaseStock is answered with the same StockReleased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stock_released_is_sent_again_for_the_resent_command_and_the_order_is_cancelled() {
    a_lost_reply_is_sent_again(
        "lost-released",
        "StockReleased",
        DECLINED_CARD,
        "ReleaseStock",
        "CANCELLED",
    )
    .await;
}

/// payment-service dies after the gateway captured the charge and before
/// recording it, and stays down past the deadline: order-api asks the
/// gateway by the operation's key, finds the capture and confirms the order
/// (`Reconciled:PaymentCaptured`). Restarted, payment-service gets the
/// command again, asks the gateway with the same key, gets the same charge
/// back and records it; its reply is ignored by the saga and is not an
/// inbox miss. One capture in the ledger throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_charged_and_payment_service_stayed_down_the_order_is_reconciled_charged_once() {
    let mut stack = crate::stack("deadline-down").await;
    short_deadlines(&mut stack).await;
    let point = payment_service::payments::CRASH_AFTER_GATEWAY_BEFORE_RECORD;
    stack.arm(Service::Payment, point);
    stack.restart(Service::Payment).await.unwrap();
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    let order = client
        .place_order(&new_key(), &widget(), Duration::from_secs(10))
        .await
        .unwrap();
    stack
        .wait_exit(Service::Payment, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(stack.crash_point_reports(Service::Payment, point), 1);
    // payment-service is down: only reconciliation can end the order.
    assert_eq!(
        client.final_status(order.id, Duration::from_secs(30)).await.unwrap(),
        "CONFIRMED"
    );
    assert!(history(&stack, order.id)
        .await
        .contains(&"Reconciled:PaymentCaptured".to_owned()));
    assert_eq!(ledger(&stack, order.id).await, (1, 0));

    stack.disarm(Service::Payment);
    stack.start_service(Service::Payment).await.unwrap();
    let mut payments = db(&stack, "payments").await;
    let started = Instant::now();
    loop {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1 AND kind = 'charge'")
                .bind(order.id)
                .fetch_optional(&mut payments)
                .await
                .unwrap();
        if status.as_deref() == Some("CAPTURED") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "payment still {status:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The late reply reaches the saga and is set aside, not applied.
    let started = Instant::now();
    while e2e::Stack::metric(
        &stack.admin_url(Service::OrderApi),
        "saga_replies_after_reconciliation_total",
        &[],
    )
    .await
    .unwrap_or(0.0)
        < 1.0
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the late reply never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(client.order(order.id).await.unwrap().status, "CONFIRMED");
    assert_eq!(
        rescued(&stack).await,
        BTreeMap::from([("Reconciled:PaymentCaptured".to_owned(), BTreeSet::from([order.id]))]),
        "the order whose payment-service stayed down, and only it, was reconciled"
    );
    assert_eq!(ledger(&stack, order.id).await, (1, 0), "charged once");
    assert_eq!(inbox_misses(&stack).await, 0);
    stack.shutdown(true).await.unwrap();
}

/// A refund the gateway refuses (fault `refuse_refunds`) sends the order to
/// MANUAL_REVIEW instead of leaving it in REFUNDING; the operator's command
/// `order-api review retry-refund` — run here as the binary — makes a new
/// refund attempt under its own key, and the order ends CANCELLED with the
/// money back and the stock released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_refund_goes_to_manual_review_and_the_operators_retry_ends_it() {
    let stack = crate::stack("manual-review").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    let order = client
        .place_order(&new_key(), &widget(), Duration::from_secs(10))
        .await
        .unwrap();
    client
        .wait_terminal(&[order.id], Duration::from_secs(30))
        .await
        .unwrap();
    client
        .set_gateway_faults(serde_json::json!({"refuse_refunds": true}))
        .await
        .unwrap();
    assert_eq!(client.cancel(&new_key(), order.id).await.unwrap().status, 202);
    let started = Instant::now();
    loop {
        let o = client.order(order.id).await.unwrap();
        if o.status == "MANUAL_REVIEW" {
            assert_eq!(o.cancel_reason.as_deref(), Some("refund_failed"));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "order is {}", o.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(ledger(&stack, order.id).await, (1, 0), "nothing refunded yet");
    client.set_gateway_faults(serde_json::json!({})).await.unwrap();

    let bin = stack.options().bin_dir.join("order-api");
    let listed = std::process::Command::new(&bin)
        .args(["review", "list"])
        .env("DATABASE_URL", stack.db_url("orders"))
        .output()
        .unwrap();
    assert!(listed.status.success());
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&order.id.to_string()) && listed.contains("refund_failed"),
        "{listed}"
    );
    let retried = std::process::Command::new(&bin)
        .args(["review", "retry-refund", &order.id.to_string()])
        .env("DATABASE_URL", stack.db_url("orders"))
        .output()
        .unwrap();
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    assert_eq!(
        client.final_status(order.id, Duration::from_secs(30)).await.unwrap(),
        "CANCELLED"
    );
    assert_eq!(
        ledger(&stack, order.id).await,
        (1, 1),
        "refunded once, by the second attempt"
    );
    assert_eq!(client.stock().await.unwrap()["WIDGET"], (10, 0), "stock released");
    stack.shutdown(true).await.unwrap();
}
