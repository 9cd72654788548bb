//! Every door locked: for every endpoint of every service, a request with
//! no credential, a wrong one, and another principal's gets the documented
//! status — and writes nothing (the tables of every database are counted
//! before and after). The admin ports' routes too (`admin`).

mod admin;

use std::time::Duration;

use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::stack::Service;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::Connection as _;

/// Row counts of the tables a request could write, in every database.
async fn footprint(stack: &e2e::Stack) -> Vec<(String, i64)> {
    let tables = [
        (
            "orders",
            ["orders", "outbox", "idempotency_keys", "api_keys"].as_slice(),
        ),
        ("inventory", ["stock", "reservations", "outbox"].as_slice()),
        ("payments", ["outbox"].as_slice()),
        (
            "gateway",
            ["ledger", "card_tokens", "idempotency_keys", "notices"].as_slice(),
        ),
    ];
    let mut out = Vec::new();
    for (db, names) in tables {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await.unwrap();
        for t in names {
            // A refused cancel by another client is stored under that
            // client's own key (a replayable 404): its scope, not a write
            // to anyone else's.
            let filter = if db == "orders" && *t == "idempotency_keys" {
                " WHERE scope <> 'another-shop'"
            } else {
                ""
            };
            let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {t}{filter}"))
                .fetch_one(&mut c)
                .await
                .unwrap();
            out.push((format!("{db}.{t}"), n));
        }
        // Stock levels too: a PUT that slipped through changes a count.
        if db == "inventory" {
            let total: i64 = sqlx::query_scalar("SELECT COALESCE(sum(available), 0)::int8 FROM stock")
                .fetch_one(&mut c)
                .await
                .unwrap();
            out.push(("inventory.available".into(), total));
        }
    }
    out
}

/// One request of the matrix.
struct Door {
    service: Service,
    method: Method,
    path: String,
    body: Option<Value>,
}

impl Door {
    fn new(service: Service, method: Method, path: &str, body: Option<Value>) -> Self {
        Self {
            service,
            method,
            path: path.to_owned(),
            body,
        }
    }

    async fn knock(&self, stack: &e2e::Stack, http: &reqwest::Client, credential: Option<&str>) -> (u16, Value) {
        let mut req = http
            .request(self.method.clone(), format!("{}{}", stack.url(self.service), self.path))
            .header("idempotency-key", new_key());
        if let Some(c) = credential {
            req = req.bearer_auth(c);
        }
        if let Some(b) = &self.body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status >= 400 {
            assert_eq!(
                content_type, "application/problem+json",
                "{} {}: {status} without problem+json",
                self.method, self.path
            );
        }
        (status, body)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wrong_or_foreign_credential_opens_any_endpoint_or_writes_anything() {
    let stack = crate::stack("access").await;
    let secrets = stack.secrets().clone();
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    let order = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 300,
        card: GOOD_CARD.into(),
    };
    let placed = client.place_and_settle(&new_key(), &order).await.unwrap();
    // Its confirmation notice goes out after the order is CONFIRMED, from
    // order-api's worker: wait for it, or it lands between the footprints.
    let mut gateway = sqlx::PgConnection::connect(&stack.db_url("gateway")).await.unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM notices")
        .fetch_one(&mut gateway)
        .await
        .unwrap()
        == 0
    {
        assert!(
            std::time::Instant::now() < end,
            "the confirmed order's notice was never sent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other_client = stack.create_api_key("another-shop").await.unwrap();
    let http = stack.http_client(Duration::from_secs(5)).unwrap();
    let wrong = "eo_0123456789abcdef0123456789abcdef01234567";
    let id = placed.id;
    let charge = json!({"order_id": id, "amount_cents": 100, "card_token": "tok_x"});
    let refund = json!({"order_id": id, "amount_cents": 100});
    // (door, another principal's credential, the status it gets)
    let matrix: Vec<(Door, &str, u16)> = vec![
        // order-api: another client's key sees no order of this client.
        (
            Door::new(Service::OrderApi, Method::GET, &format!("/orders/{id}"), None),
            &other_client,
            404,
        ),
        (
            Door::new(
                Service::OrderApi,
                Method::POST,
                &format!("/orders/{id}/cancel"),
                Some(json!({})),
            ),
            &other_client,
            404,
        ),
        // A gateway credential is not an API key.
        (
            Door::new(Service::OrderApi, Method::POST, "/orders", Some(json!(order))),
            &secrets.payment_gateway,
            401,
        ),
        // The gateway: an API key or the operator's credential is no caller;
        // a caller reads another's movements only under a grant.
        (
            Door::new(
                Service::Gateway,
                Method::POST,
                "/v1/tokens",
                Some(json!({"card": GOOD_CARD})),
            ),
            stack.api_key(),
            401,
        ),
        (
            Door::new(Service::Gateway, Method::POST, "/v1/charges", Some(charge.clone())),
            &secrets.operator,
            401,
        ),
        (
            Door::new(Service::Gateway, Method::POST, "/v1/refunds", Some(refund.clone())),
            stack.api_key(),
            401,
        ),
        (
            Door::new(Service::Gateway, Method::GET, "/v1/ledger?client=order-api", None),
            &secrets.payment_gateway,
            403,
        ),
        (
            Door::new(
                Service::Gateway,
                Method::GET,
                "/v1/operations/any?client=order-api",
                None,
            ),
            &secrets.payment_gateway,
            403,
        ),
        (
            Door::new(
                Service::Gateway,
                Method::PUT,
                "/admin/faults",
                Some(json!({"fail_rate": 1.0})),
            ),
            &secrets.operator,
            401,
        ),
        // inventory: only the operator.
        (
            Door::new(Service::Inventory, Method::GET, "/stock", None),
            &secrets.payment_gateway,
            401,
        ),
        (
            Door::new(
                Service::Inventory,
                Method::PUT,
                "/stock/WIDGET",
                Some(json!({"available": 999})),
            ),
            stack.api_key(),
            401,
        ),
        // The gateway's own callers, each on the other's routes: a known
        // credential without the route's grant (GATEWAY_GRANTS) is a 403.
        (
            Door::new(Service::Gateway, Method::POST, "/v1/charges", Some(charge.clone())),
            &secrets.order_api_gateway,
            403,
        ),
        (
            Door::new(Service::Gateway, Method::POST, "/v1/refunds", Some(refund.clone())),
            &secrets.order_api_gateway,
            403,
        ),
        (
            Door::new(
                Service::Gateway,
                Method::POST,
                "/v1/tokens",
                Some(json!({"card": GOOD_CARD})),
            ),
            &secrets.payment_gateway,
            403,
        ),
        (
            Door::new(
                Service::Gateway,
                Method::POST,
                "/v1/notices",
                Some(json!({"order_id": uuid::Uuid::new_v4(), "text": "hello"})),
            ),
            &secrets.payment_gateway,
            403,
        ),
    ];
    let before = footprint(&stack).await;
    let mut seen = Vec::new();
    for (door, foreign, expected) in &matrix {
        for (label, credential, want) in [
            ("none", None, 401),
            ("wrong", Some(wrong), 401),
            ("foreign", Some(*foreign), *expected),
        ] {
            let (status, body) = door.knock(&stack, &http, credential).await;
            assert_eq!(
                status, want,
                "{} {} with {label} credential: {body}",
                door.method, door.path
            );
            seen.push(format!("{} {} {label} → {status}", door.method, door.path));
        }
    }
    assert_eq!(footprint(&stack).await, before, "a refused request wrote something");
    // The owners themselves still get in (the doors are not simply shut).
    let (status, _) = matrix[0].0.knock(&stack, &http, Some(stack.api_key())).await;
    assert_eq!(status, 200);
    let (status, _) = Door::new(Service::Gateway, Method::GET, "/v1/ledger", None)
        .knock(&stack, &http, Some(&secrets.payment_gateway))
        .await;
    assert_eq!(status, 200);
    let (status, _) = Door::new(Service::Gateway, Method::GET, "/v1/ledger?client=payment-service", None)
        .knock(&stack, &http, Some(&secrets.order_api_gateway))
        .await;
    assert_eq!(status, 200, "order-api's grant reads payment-service's movements");
    let (status, _) = matrix[9].0.knock(&stack, &http, Some(&secrets.operator)).await;
    assert_eq!(status, 200);
    // order-api's credential at the participants' admin records opens no
    // operator's door on their API ports.
    let (status, _) = matrix[9].0.knock(&stack, &http, Some(&secrets.order_api_reader)).await;
    assert_eq!(status, 401, "the journey reader is no operator of stock");
    let admin = admin::every_admin_route(&stack, &http, id).await;
    assert_eq!(footprint(&stack).await, before, "an admin request wrote something");
    println!(
        "admin ports: {} requests as documented:\n{}",
        admin.len(),
        admin.join("\n")
    );
    println!(
        "access: {} requests refused as documented:\n{}",
        seen.len(),
        seen.join("\n")
    );
    stack.shutdown(true).await.unwrap();
}
