//! A compromised service stays in its lane: a participant that writes
//! another service's message into its own outbox — inventory-service
//! forging `PaymentCaptured` to confirm an unpaid order — is stopped at the
//! relay (the row parked, refused), and a forged record that reaches the
//! log anyway (another principal's, or no stamp at all) is stopped at the
//! consumer (dead-lettered, refused). The order waits for the real payment,
//! and the stack says what it refused. A record from the right producer
//! that reuses a recorded event id for another fact is dead-lettered too
//! (the inbox's fingerprint), not absorbed as a copy.

use std::time::{Duration, Instant};

use contract::producers::INVENTORY;
use contract::topics::ORDER_EVENTS;
use contract::{Envelope, Message};
use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::stack::Service;
use sqlx::Connection as _;
use uuid::Uuid;

/// A `PaymentCaptured` for `order` that payment-service never sent.
fn forged(order: Uuid) -> Envelope {
    Envelope::new(
        order,
        &Message::PaymentCaptured {
            charge_id: "ch_forged".into(),
        },
        None,
    )
}

async fn status(client: &Client, order: Uuid) -> String {
    client.order(order).await.unwrap().status
}

/// Polls `check` every 200 ms for up to `within`; whether it came true.
async fn eventually<F: std::future::Future<Output = bool>>(within: Duration, mut check: impl FnMut() -> F) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Checked against two removals, each making the test fail: the relay
/// without its guard (`guard::Guarded` passing every row: the forged row is
/// published and the saga refuses it, but nothing is parked), and the
/// consumer without `saga_kit::consumer::admit` (the forged record
/// confirms the unpaid order). The reuse part, against the inbox's
/// fingerprint comparison dropped: the metric never moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_services_message_never_reaches_the_saga_as_a_fact() {
    let mut stack = crate::stack("producers").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    // payment-service down: the order waits in AWAITING_PAYMENT for it.
    stack.kill(Service::Payment).await.unwrap();
    let request = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 700,
        card: GOOD_CARD.into(),
    };
    let order = client
        .place_order(&new_key(), &request, Duration::from_secs(10))
        .await
        .unwrap()
        .id;
    assert!(
        eventually(Duration::from_secs(30), || async {
            status(&client, order).await == "AWAITING_PAYMENT"
        })
        .await,
        "the order reaches AWAITING_PAYMENT"
    );

    // 1. inventory-service's own outbox, as a compromised inventory-service would write it.
    let mut inventory = sqlx::PgConnection::connect(&stack.db_url("inventory")).await.unwrap();
    let envelope = forged(order);
    outbox::enqueue(
        &mut inventory,
        &outbox::OutboxEvent {
            topic: ORDER_EVENTS,
            key: order.to_string(),
            event_id: envelope.event_id,
            event_type: &envelope.event_type,
            traceparent: None,
            body: String::from_utf8(envelope.to_bytes()).unwrap(),
        },
    )
    .await
    .unwrap();
    // 2. Straight into the log: stamped as inventory's, and with no stamp.
    let producer = kafka::producer(&stack.kafka()).unwrap();
    for stamp in [Some(INVENTORY), None] {
        let envelope = forged(order);
        let headers = kafka::headers(&envelope.event_id.to_string(), &envelope.event_type, None);
        let headers = match stamp {
            Some(p) => kafka::stamp(headers, p),
            None => headers,
        };
        kafka::publish(
            &producer,
            ORDER_EVENTS,
            &order.to_string(),
            &envelope.to_bytes(),
            headers,
        )
        .await
        .unwrap();
    }

    // The relay parks its row, saying why, and sends nothing.
    let parked = || async {
        let error: Option<Option<String>> = sqlx::query_scalar(
            "SELECT last_error FROM outbox WHERE event_type = 'PaymentCaptured' AND parked_at IS NOT NULL",
        )
        .fetch_optional(&mut sqlx::PgConnection::connect(&stack.db_url("inventory")).await.unwrap())
        .await
        .unwrap();
        error
            .flatten()
            .is_some_and(|e| e.contains("inventory-service may not send PaymentCaptured"))
    };
    assert!(
        eventually(Duration::from_secs(20), parked).await,
        "the relay parks the forged row"
    );
    let relay = stack.admin_url(Service::Relay);
    assert_eq!(
        e2e::Stack::metric(&relay, "relay_refused_total", &[("producer", INVENTORY)]).await,
        Some(1.0)
    );
    // The saga dead-letters both records that got into the log.
    let api = stack.admin_url(Service::OrderApi);
    let refused = || async { e2e::Stack::metric(&api, "consumer_refused_total", &[]).await == Some(2.0) };
    assert!(
        eventually(Duration::from_secs(20), refused).await,
        "order-api refuses both records"
    );
    let mut letters = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while letters.len() < 2 && Instant::now() < end {
        letters = kafka::dlq::list(&stack.kafka(), ORDER_EVENTS).unwrap();
    }
    assert_eq!(letters.len(), 2, "{letters:?}");
    for letter in &letters {
        let error = letter.error.clone().unwrap_or_default();
        assert!(error.contains("refused: "), "{error}");
    }
    assert_eq!(
        status(&client, order).await,
        "AWAITING_PAYMENT",
        "nothing confirmed the unpaid order"
    );
    let causes: Vec<String> = sqlx::query_scalar("SELECT cause FROM order_history WHERE order_id = $1")
        .bind(order)
        .fetch_all(&mut sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap())
        .await
        .unwrap();
    assert!(!causes.iter().any(|c| c.contains("PaymentCaptured")), "{causes:?}");

    // The real payment still goes through, once.
    stack.start_service(Service::Payment).await.unwrap();
    assert_eq!(
        client.final_status(order, Duration::from_secs(60)).await.unwrap(),
        "CONFIRMED"
    );
    let charges: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ledger WHERE order_id = $1 AND kind = 'charge' AND status = 'captured'",
    )
    .bind(order)
    .fetch_one(&mut sqlx::PgConnection::connect(&stack.db_url("gateway")).await.unwrap())
    .await
    .unwrap();
    assert_eq!(charges, 1);

    // 3. An id used again for another fact (issue 59): the StockReserved's
    // id the saga recorded, on a StockRejected from the right producer. Not
    // a copy — the inbox kept the first fact's type and digest — so not
    // absorbed; not new, so not applied: dead-lettered, counted, paged.
    let saga = contract::topics::consumers::ORDER_SAGA.name;
    let reserved: Uuid =
        sqlx::query_scalar("SELECT event_id FROM inbox WHERE consumer = $1 AND event_type = 'StockReserved'")
            .bind(saga)
            .fetch_one(&mut sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap())
            .await
            .unwrap();
    let mut reuse = Envelope::new(
        order,
        &Message::StockRejected {
            reason: "out of stock".into(),
        },
        None,
    );
    reuse.event_id = reserved;
    let headers = kafka::headers(&reuse.event_id.to_string(), &reuse.event_type, None);
    kafka::publish(
        &producer,
        ORDER_EVENTS,
        &order.to_string(),
        &reuse.to_bytes(),
        kafka::stamp(headers, INVENTORY),
    )
    .await
    .unwrap();
    let counted =
        || async { e2e::Stack::metric(&api, "inbox_reused_ids_total", &[("consumer", saga)]).await == Some(1.0) };
    assert!(
        eventually(Duration::from_secs(20), counted).await,
        "order-api counts the reused id"
    );
    let end = Instant::now() + Duration::from_secs(20);
    while letters.len() < 3 && Instant::now() < end {
        letters = kafka::dlq::list(&stack.kafka(), ORDER_EVENTS).unwrap();
    }
    let reused: Vec<_> = letters
        .iter()
        .filter(|l| l.error.as_deref().is_some_and(|e| e.contains("event id reused")))
        .collect();
    assert_eq!(reused.len(), 1, "{letters:?}");
    assert_eq!(
        status(&client, order).await,
        "CONFIRMED",
        "the second fact changed nothing"
    );
    stack.shutdown(true).await.unwrap();
}
