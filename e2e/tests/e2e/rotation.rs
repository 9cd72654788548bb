//! Every secret rotated while clients place orders, each the way
//! docs/operations.md says ("Rotate …"), and no order fails: the gateway's
//! two callers' credentials and the operator's (old and new accepted, then
//! the old dropped), both Idempotency-Key fingerprint keys and the vault
//! key (the old one kept as `…_PREVIOUS`: a retry stored under it still
//! matches, a known card keeps its token), and the client's API key (a new
//! one, then the old revoked). Each service restarts for it, as it would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::stack::{Secrets, Service, DRIVER_CLIENT};
use uuid::Uuid;

/// Clients placing orders until told to stop, each with the API key
/// current when it starts an order; what they got.
struct Load {
    stop: Arc<AtomicBool>,
    key: Arc<Mutex<String>>,
    placed: Arc<Mutex<Vec<Uuid>>>,
    failures: Arc<Mutex<Vec<String>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &Client, workers: usize) -> Self {
        let load = Self {
            stop: Arc::default(),
            key: Arc::new(Mutex::new(client.api_key.clone())),
            placed: Arc::default(),
            failures: Arc::default(),
            workers: Vec::new(),
        };
        let workers = (0..workers)
            .map(|i| {
                let (stop, key, placed, failures) = (
                    load.stop.clone(),
                    load.key.clone(),
                    load.placed.clone(),
                    load.failures.clone(),
                );
                let mut client = client.clone();
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        client.api_key = key.lock().unwrap().clone();
                        let order = OrderRequest {
                            sku: "WIDGET".into(),
                            quantity: 1,
                            amount_cents: 100 + (i * 10_000 + n) as i64,
                            card: GOOD_CARD.into(),
                        };
                        // A careful client: the same key until answered.
                        match client.place_order(&new_key(), &order, Duration::from_secs(60)).await {
                            Ok(o) => placed.lock().unwrap().push(o.id),
                            Err(e) => failures.lock().unwrap().push(format!("{e:#}")),
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                })
            })
            .collect();
        Self { workers, ..load }
    }

    fn use_key(&self, key: &str) {
        *self.key.lock().unwrap() = key.to_owned();
    }

    fn placed(&self) -> usize {
        self.placed.lock().unwrap().len()
    }

    async fn stop(self) -> (Vec<Uuid>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.await.unwrap();
        }
        let placed = self.placed.lock().unwrap().clone();
        let failures = self.failures.lock().unwrap().clone();
        (placed, failures)
    }
}

/// Waits until the clients placed `more` orders beyond what they had.
async fn more_orders(load: &Load, more: usize) {
    let target = load.placed() + more;
    for _ in 0..600 {
        if load.placed() >= target {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the clients placed no {more} more orders in 60 s");
}

/// `GET url` with `Authorization: Bearer secret`: its status (the
/// gateway's CA trusted).
async fn status_with(stack: &e2e::Stack, url: &str, secret: &str) -> u16 {
    stack
        .http_client(Duration::from_secs(10))
        .unwrap()
        .get(url)
        .bearer_auth(secret)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_secret_rotated_under_load_fails_no_order() {
    let mut stack = crate::stack("rotation").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 100_000).await.unwrap();
    let (old, new) = (stack.secrets().clone(), Secrets::generate());
    let load = Load::start(&client, 4);
    more_orders(&load, 20).await;

    // 1. The gateway learns every new secret beside the old one.
    let callers = |s: &[&Secrets]| {
        s.iter()
            .flat_map(|s| {
                [
                    format!("order-api={}", s.order_api_gateway),
                    format!("payment-service={}", s.payment_gateway),
                ]
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    stack.set_env(Service::Gateway, "GATEWAY_CLIENTS", &callers(&[&old, &new]));
    stack.set_env(Service::Gateway, "GATEWAY_VAULT_KEY", &new.vault);
    stack.set_env(Service::Gateway, "GATEWAY_VAULT_KEY_PREVIOUS", &old.vault);
    stack.set_env(
        Service::Gateway,
        "IDEMPOTENCY_FINGERPRINT_KEY",
        &new.gateway_fingerprint,
    );
    stack.set_env(
        Service::Gateway,
        "IDEMPOTENCY_FINGERPRINT_KEY_PREVIOUS",
        &old.gateway_fingerprint,
    );
    stack.restart(Service::Gateway).await.unwrap();
    more_orders(&load, 10).await;
    // An order acknowledged before order-api's rotation, whose client lost
    // the answer: it sends the same request again after it.
    let lost_answer = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 99,
        card: GOOD_CARD.into(),
    };
    let resent_key = new_key();
    let first = client
        .place_order(&resent_key, &lost_answer, Duration::from_secs(30))
        .await
        .unwrap();
    // 2. The services move to theirs.
    stack.set_env(Service::OrderApi, "GATEWAY_API_KEY", &new.order_api_gateway);
    stack.set_env(
        Service::OrderApi,
        "IDEMPOTENCY_FINGERPRINT_KEY",
        &new.order_api_fingerprint,
    );
    stack.set_env(
        Service::OrderApi,
        "IDEMPOTENCY_FINGERPRINT_KEY_PREVIOUS",
        &old.order_api_fingerprint,
    );
    stack.restart(Service::OrderApi).await.unwrap();
    let again = client.post_order(&resent_key, &lost_answer).await.unwrap();
    assert_eq!((again.status, again.replayed), (201, true), "{}", again.body);
    assert!(
        again.body.contains(&first.id.to_string()),
        "the same order: {}",
        again.body
    );
    more_orders(&load, 10).await;
    stack.set_env(Service::Payment, "GATEWAY_API_KEY", &new.payment_gateway);
    stack.restart(Service::Payment).await.unwrap();
    stack.set_env(Service::Inventory, "OPERATOR_KEY", &new.operator);
    stack.set_env(Service::Inventory, "OPERATOR_KEY_PREVIOUS", &old.operator);
    stack.restart(Service::Inventory).await.unwrap();
    let stock = format!("{}/stock", stack.url(Service::Inventory));
    assert_eq!(
        status_with(&stack, &stock, &old.operator).await,
        200,
        "the old operator key, while both are accepted"
    );
    assert_eq!(status_with(&stack, &stock, &new.operator).await, 200);
    more_orders(&load, 10).await;
    // The client's API key: a new one, used, then the old one revoked.
    let orders = sqlx::PgPool::connect(&stack.db_url("orders")).await.unwrap();
    let old_api_key = client.api_key.clone();
    let old_key_id: Uuid = sqlx::query_scalar("SELECT id FROM api_keys WHERE client_id = $1")
        .bind(DRIVER_CLIENT)
        .fetch_one(&orders)
        .await
        .unwrap();
    let (_, new_api_key) = order_api::auth::create_key(&orders, DRIVER_CLIENT).await.unwrap();
    load.use_key(&new_api_key);
    // Every order started with the old key has been answered by now.
    more_orders(&load, 40).await;
    assert!(order_api::auth::revoke_key(&orders, old_key_id).await.unwrap());

    // 3. The gateway and inventory forget the old credentials. The old
    // fingerprint and vault keys stay accepted, as long as keys stored
    // under them live (docs/operations.md).
    stack.set_env(Service::Gateway, "GATEWAY_CLIENTS", &callers(&[&new]));
    stack.restart(Service::Gateway).await.unwrap();
    stack.set_env(Service::Inventory, "OPERATOR_KEY_PREVIOUS", "");
    stack.restart(Service::Inventory).await.unwrap();
    more_orders(&load, 20).await;
    let (mut placed, failures) = load.stop().await;
    placed.push(first.id);
    assert_eq!(failures, Vec::<String>::new(), "every order was acknowledged");

    // Every order ended CONFIRMED, with one card token across the vault's rotation.
    let finals = client.wait_terminal(&placed, Duration::from_secs(120)).await.unwrap();
    let not_confirmed: Vec<_> = finals.values().filter(|o| o.status != "CONFIRMED").collect();
    assert!(
        not_confirmed.is_empty(),
        "{} of {}: {not_confirmed:?}",
        not_confirmed.len(),
        placed.len()
    );
    let tokens: i64 = sqlx::query_scalar("SELECT count(DISTINCT card_token) FROM orders")
        .fetch_one(&orders)
        .await
        .unwrap();
    assert_eq!(tokens, 1, "one card, one token, across the vault key's rotation");
    // The old credentials are refused now, the new ones accepted.
    let ledger = format!("{}/v1/ledger?limit=1", stack.url(Service::Gateway));
    for (name, old, new) in [
        ("order-api", &old.order_api_gateway, &new.order_api_gateway),
        ("payment-service", &old.payment_gateway, &new.payment_gateway),
    ] {
        assert_eq!(status_with(&stack, &ledger, old).await, 401, "{name}'s old gateway key");
        assert_ne!(status_with(&stack, &ledger, new).await, 401, "{name}'s new gateway key");
    }
    assert_eq!(
        status_with(&stack, &stock, &old.operator).await,
        401,
        "the old operator key"
    );
    assert_eq!(status_with(&stack, &stock, &new.operator).await, 200);
    let order = format!("{}/orders/{}", stack.url(Service::OrderApi), placed[0]);
    // A revoked key is refused within API_KEY_CACHE_SECS (30 s by default).
    let mut refused = false;
    for _ in 0..70 {
        if status_with(&stack, &order, &old_api_key).await == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(refused, "the revoked API key is still accepted");
    assert_eq!(status_with(&stack, &order, &new_api_key).await, 200);
    println!("{} orders placed across the rotation, all CONFIRMED", placed.len());
}
