//! payment-service against a real database and a local gateway: the
//! command handler's charge, decline and refund paths (`handle`), and the
//! PENDING settlement.
//!
//! The settlement: against a real database and a local
//! gateway: an operation recorded PENDING whose charge the gateway holds
//! (the service crashed between the charge and its record, and its command
//! went to the dead-letter topic) is settled from the gateway's record once
//! overdue — status, gateway reference and the reply the command would have
//! sent; one the gateway never saw stays PENDING for the order's deadline.

use std::time::Duration;

use payment_service::{gateway, reconcile, Deps};
use uuid::Uuid;

mod handle;

struct Fixture {
    deps: Deps,
    gateway: mock_gateway::LocalGateway,
    _dbs: (testkit::TempDb, testkit::TempDb),
}

async fn fixture() -> Fixture {
    let (db, pool) = testkit::TempDb::with_pool(
        "eo_pay_settle",
        4,
        vec![
            outbox::migrator(),
            inbox::migrator(),
            sqlx::migrate!("../../migrations/payments"),
        ],
    )
    .await
    .expect("payments database");
    let gateway_db = testkit::TempDb::new("eo_pay_settle_gw");
    let local = mock_gateway::start_local(gateway_db.url(), Default::default())
        .await
        .expect("gateway");
    let client = gateway::Client::new(&local.url, local.payment_key.expose(), Duration::from_secs(5)).unwrap();
    Fixture {
        deps: Deps { pool, gateway: client },
        gateway: local,
        _dbs: (db, gateway_db),
    }
}

impl Fixture {
    /// A token for a card that charges (order-api's side of the vault).
    async fn card_token(&self) -> String {
        self.token_of("4242424242424242").await
    }

    /// A token for `card`.
    async fn token_of(&self, card: &str) -> String {
        let token: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/v1/tokens", self.gateway.url))
            .bearer_auth(self.gateway.order_api_key.expose())
            .json(&serde_json::json!({ "card": card }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        token["token"].as_str().expect("a token").to_owned()
    }

    /// The charge of `order` recorded PENDING (step 1 of the handler) a
    /// minute ago; returns its gateway key.
    async fn pending_charge(&self, order: Uuid) -> String {
        let key = contract::message::PaymentOperation {
            order_id: order,
            kind: contract::message::PaymentKind::Charge,
            attempt: 1,
        }
        .gateway_key();
        sqlx::query(
            "INSERT INTO payments (order_id, kind, idempotency_key, amount_cents, status, updated_at)
             VALUES ($1, 'charge', $2, 1500, 'PENDING', now() - interval '1 minute')",
        )
        .bind(order)
        .bind(&key)
        .execute(&self.deps.pool)
        .await
        .unwrap();
        key
    }

    async fn payment(&self, order: Uuid) -> (String, Option<String>) {
        sqlx::query_as("SELECT status, gateway_ref FROM payments WHERE order_id = $1 AND kind = 'charge'")
            .bind(order)
            .fetch_one(&self.deps.pool)
            .await
            .unwrap()
    }

    /// The gateway's ledger for `order`: (kind, status), oldest first.
    async fn ledger(&self, order: Uuid) -> Vec<(String, String)> {
        let pool = sqlx::PgPool::connect(self._dbs.1.url()).await.unwrap();
        let rows = sqlx::query_as("SELECT kind, status FROM ledger WHERE order_id = $1 ORDER BY created_at, id")
            .bind(order)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows
    }

    /// The payment row of `order` and `kind`: status and attempts.
    async fn operation(&self, order: Uuid, kind: &str) -> (String, i32) {
        sqlx::query_as("SELECT status, attempts FROM payments WHERE order_id = $1 AND kind = $2")
            .bind(order)
            .bind(kind)
            .fetch_one(&self.deps.pool)
            .await
            .unwrap()
    }

    async fn replies(&self, order: Uuid) -> Vec<String> {
        sqlx::query_scalar("SELECT envelope->>'event_type' FROM outbox WHERE message_key = $1 ORDER BY id")
            .bind(order.to_string())
            .fetch_all(&self.deps.pool)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn an_overdue_pending_charge_the_gateway_captured_is_settled_with_its_reply() {
    let f = fixture().await;
    let (charged, unseen) = (Uuid::now_v7(), Uuid::now_v7());
    let key = f.pending_charge(charged).await;
    f.pending_charge(unseen).await;
    // The money moved under the key; the record of it never committed.
    let token = f.card_token().await;
    let body = gateway_client::api::ChargeRequest {
        order_id: charged,
        amount_cents: 1500,
        card_token: token,
    };
    let reply = gateway::Reply::of(&f.deps.gateway.charge(&key, &body).await.unwrap());
    let gateway::Reply::Done(entry) = reply else {
        panic!("the charge was not captured: {reply:?}")
    };

    let report = reconcile::tick(&f.deps, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        (report.overdue, report.settled, report.absent, report.skipped),
        (2, 1, 1, 0),
        "{report:?}"
    );
    assert_eq!(f.payment(charged).await, ("CAPTURED".to_owned(), Some(entry)));
    assert_eq!(
        f.replies(charged).await,
        ["PaymentCaptured"],
        "the reply the command would have sent"
    );
    assert_eq!(
        f.payment(unseen).await,
        ("PENDING".to_owned(), None),
        "no money moved under its key"
    );
    assert!(f.replies(unseen).await.is_empty());

    // Settled once: the next scan finds nothing overdue for it.
    let again = reconcile::tick(&f.deps, Duration::from_secs(30)).await.unwrap();
    assert_eq!((again.settled, f.replies(charged).await.len()), (0, 1), "{again:?}");
}
