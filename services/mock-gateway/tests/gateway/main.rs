//! mock-gateway over HTTP against a real PostgreSQL.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::TempDb;
use uuid::Uuid;

mod vault;

struct Gateway {
    base: String,
    /// The admin endpoints' base URL (health, metrics, the API's description).
    admin: String,
    /// Presents caller `tests`'s credential on every request.
    http: reqwest::Client,
    /// Caller `someone-else`'s credential.
    other_key: String,
    /// Dropped with this value, also when the test panics.
    _db: TempDb,
    token: tokio_util::sync::CancellationToken,
}

impl Gateway {
    async fn start(faults: mock_gateway::faults::Faults) -> Self {
        Self::start_with(faults, 1_000).await
    }

    /// A gateway letting each caller tokenise `tokenise_per_sec` cards a
    /// second (bursts to twice that).
    async fn start_with(faults: mock_gateway::faults::Faults, tokenise_per_sec: u32) -> Self {
        let db = TempDb::new("eo_gw");
        let (key, other_key) = ("t".repeat(40), "o".repeat(40));
        let config = mock_gateway::Config {
            db: service_kit::DbArgs {
                url: db.url().to_owned(),
                pool_size: 16,
            },
            http_addr: "127.0.0.1:0".parse().unwrap(),
            admin_addr: "127.0.0.1:0".parse().unwrap(),
            http: service_kit::ServeArgs::default(),
            clients: format!("tests={key},someone-else={other_key}").parse().unwrap(),
            readers: Default::default(),
            grants: "tests=tokenise+charge+refund+read+notify,someone-else=tokenise+charge+refund+read+notify"
                .parse()
                .unwrap(),
            tokenise_per_sec,
            admin: true,
            keys: idempotency::KeyArgs {
                ttl_secs: 86_400,
                fingerprint_key: "f".repeat(40).parse().unwrap(),
                previous_fingerprint_key: None,
            },
            vault_key: "v".repeat(40).parse().unwrap(),
            previous_vault_key: None,
            faults,
            switches: Default::default(),
            log: service_kit::LogArgs::default(),
        };
        let app = mock_gateway::build(config).await.unwrap();
        let base = format!("http://{}", app.local_addr());
        let admin = format!("http://{}", app.admin_addr());
        let token = tokio_util::sync::CancellationToken::new();
        tokio::spawn(app.run(token.clone()));
        let auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).unwrap();
        let http = reqwest::Client::builder()
            .default_headers(reqwest::header::HeaderMap::from_iter([(
                reqwest::header::AUTHORIZATION,
                auth,
            )]))
            .build()
            .unwrap();
        Self {
            base,
            admin,
            http,
            other_key,
            _db: db,
            token,
        }
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> (u16, bool, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
            .json(body)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let replayed = r.headers().get("idempotent-replayed").is_some();
        (status, replayed, r.json().await.unwrap())
    }

    /// POST as caller `someone-else`.
    async fn post_as(&self, client: &str, path: &str, key: &str, body: &Value) -> (u16, Value) {
        assert_eq!(client, "someone-else");
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.other_key)
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// The vault's token of `card`.
    async fn token(&self, card: &str) -> String {
        let r = self
            .http
            .post(format!("{}/v1/tokens", self.base))
            .json(&json!({ "card": card }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["last4"], card[card.len() - 4..]);
        body["token"].as_str().unwrap().to_owned()
    }

    /// GET as caller `tests` or `someone-else`.
    async fn get(&self, path: &str, client: &str) -> (u16, Value) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if client == "someone-else" {
            req = req.bearer_auth(&self.other_key);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// Caller `tests`'s ledger entries (one page).
    async fn ledger(&self) -> Vec<Value> {
        let page: Value = self
            .http
            .get(format!("{}/v1/ledger", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        page["entries"].as_array().unwrap().clone()
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The database goes with `_db`.
    }
}

fn charge(order: Uuid, amount: i64, card_token: &str) -> Value {
    json!({"order_id": order, "amount_cents": amount, "card_token": card_token})
}

#[tokio::test]
async fn same_key_returns_the_original_and_other_parameters_are_refused() {
    let gw = Gateway::start(Default::default()).await;
    let order = Uuid::new_v4();
    let (s1, r1, b1) = gw
        .post(
            "/v1/charges",
            "charge-1",
            &charge(order, 500, &gw.token("4242424242424242").await),
        )
        .await;
    assert_eq!((s1, r1), (201, false));
    assert_eq!(b1["status"], "captured");
    let (s2, r2, b2) = gw
        .post(
            "/v1/charges",
            "charge-1",
            &charge(order, 500, &gw.token("4242424242424242").await),
        )
        .await;
    assert_eq!((s2, r2), (201, true));
    assert_eq!(b2, b1, "the original charge, not a new one");
    let (s3, _, b3) = gw
        .post(
            "/v1/charges",
            "charge-1",
            &charge(order, 900, &gw.token("4242424242424242").await),
        )
        .await;
    assert_eq!(s3, 422, "{b3}");
    assert_eq!(gw.ledger().await.len(), 1);
    gw.stop().await;
}

#[tokio::test]
async fn declines_by_card_and_refunds_only_what_was_captured() {
    let gw = Gateway::start(Default::default()).await;
    let (s, _, b) = gw
        .post(
            "/v1/charges",
            "d-1",
            &charge(Uuid::new_v4(), 500, &gw.token(mock_gateway::DECLINED_CARD).await),
        )
        .await;
    assert_eq!((s, b["status"].as_str()), (402, Some("declined")));
    let order = Uuid::new_v4();
    gw.post(
        "/v1/charges",
        "c-1",
        &charge(order, 500, &gw.token("4242424242424242").await),
    )
    .await;
    let (s, _, _) = gw
        .post("/v1/refunds", "r-1", &json!({"order_id": order, "amount_cents": 500}))
        .await;
    assert_eq!(s, 201);
    let (s, _, _) = gw
        .post("/v1/refunds", "r-2", &json!({"order_id": order, "amount_cents": 1}))
        .await;
    assert_eq!(s, 422, "nothing left to refund");
    let (s, replayed, _) = gw
        .post("/v1/refunds", "r-1", &json!({"order_id": order, "amount_cents": 500}))
        .await;
    assert_eq!((s, replayed), (201, true), "a retried refund is the same refund");
    assert_eq!(gw.ledger().await.len(), 3);
    gw.stop().await;
}

/// Money sums are checked, not wrapped: a refund of `i64::MAX` after a
/// refund of one cent would overflow `refunded + amount` into a negative
/// total that passes `<= captured`. Every amount is capped, and only the
/// caller's own movements of an order count.
#[tokio::test]
async fn a_refund_that_would_wrap_or_exceed_the_cap_is_refused_and_the_ledger_unchanged() {
    let gw = Gateway::start(Default::default()).await;
    let order = Uuid::new_v4();
    let token = gw.token("4242424242424242").await;
    assert_eq!(gw.post("/v1/charges", "c-1", &charge(order, 500, &token)).await.0, 201);
    let refund = |cents: i64| json!({"order_id": order, "amount_cents": cents});
    assert_eq!(gw.post("/v1/refunds", "r-1", &refund(1)).await.0, 201);
    let before = gw.ledger().await.len();
    let (s, _, body) = gw.post("/v1/refunds", "r-2", &refund(i64::MAX)).await;
    assert_eq!(s, 422, "{body}");
    let (s, _, body) = gw
        .post(
            "/v1/refunds",
            "r-3",
            &refund(mock_gateway::ledger::MAX_AMOUNT_CENTS + 1),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    let (s, _, body) = gw
        .post("/v1/charges", "c-2", &charge(Uuid::new_v4(), i64::MAX, &token))
        .await;
    assert_eq!(s, 422, "{body}");
    assert_eq!(gw.ledger().await.len(), before, "nothing recorded");
    // The rest of what was captured can still be refunded, and no more.
    assert_eq!(gw.post("/v1/refunds", "r-4", &refund(499)).await.0, 201);
    assert_eq!(gw.post("/v1/refunds", "r-5", &refund(1)).await.0, 422);
    gw.stop().await;
}

/// The notifier counts every notice (no key: the same body twice is two),
/// and refuses text PostgreSQL cannot store (a NUL) with a 422, not a 500.
#[tokio::test]
async fn the_notifier_counts_every_notice_and_refuses_a_nul_with_a_422() {
    let gw = Gateway::start(Default::default()).await;
    let notice = json!({"order_id": Uuid::new_v4(), "text": "confirmed"});
    for _ in 0..2 {
        let r = gw
            .http
            .post(format!("{}/v1/notices", gw.base))
            .json(&notice)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    let nul = json!({"order_id": Uuid::new_v4(), "text": "a\u{0}b"});
    let r = gw
        .http
        .post(format!("{}/v1/notices", gw.base))
        .json(&nul)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    gw.stop().await;
}

/// Another client cannot refund a charge it did not make, even under the
/// same order id: only the caller's own movements count.
#[tokio::test]
async fn a_refund_counts_only_the_callers_own_charges() {
    let gw = Gateway::start(Default::default()).await;
    let order = Uuid::new_v4();
    let token = gw.token("4242424242424242").await;
    assert_eq!(gw.post("/v1/charges", "c-1", &charge(order, 500, &token)).await.0, 201);
    let (s, body) = gw
        .post_as(
            "someone-else",
            "/v1/refunds",
            "r-1",
            &json!({"order_id": order, "amount_cents": 500}),
        )
        .await;
    assert_eq!(s, 422, "nothing captured by someone-else: {body}");
    assert_eq!(gw.ledger().await.len(), 1, "the charge alone");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_with_one_key_charge_once() {
    let gw = std::sync::Arc::new(
        Gateway::start(mock_gateway::faults::Faults {
            latency_ms: 0,
            hang_ms: 30_000,
            ..Default::default()
        })
        .await,
    );
    let order = Uuid::new_v4();
    let card = gw.token("4242424242424242").await;
    let replies = futures::future::join_all((0..10).map(|_| {
        let (gw, card) = (gw.clone(), card.clone());
        async move { gw.post("/v1/charges", "same", &charge(order, 100, &card)).await }
    }))
    .await;
    let fresh = replies.iter().filter(|r| r.0 == 201 && !r.1).count();
    let ok = replies.iter().all(|r| r.0 == 201 || r.0 == 409);
    assert_eq!(fresh, 1, "{:?}", replies.iter().map(|r| r.0).collect::<Vec<_>>());
    assert!(ok);
    assert_eq!(gw.ledger().await.len(), 1);
    std::sync::Arc::into_inner(gw).unwrap().stop().await;
}

#[tokio::test]
async fn injected_faults_fail_before_commit_or_commit_then_hang() {
    let faults = mock_gateway::faults::Faults {
        fail_rate: 1.0,
        hang_ms: 5_000,
        ..Default::default()
    };
    let gw = Gateway::start(faults).await;
    let order = Uuid::new_v4();
    let (s, _, _) = gw
        .post(
            "/v1/charges",
            "k",
            &charge(order, 100, &gw.token("4242424242424242").await),
        )
        .await;
    assert_eq!(s, 503);
    assert!(gw.ledger().await.is_empty(), "a 503 charged nothing");
    // Commit, then hang past the client's 2 s timeout: the ambiguous case.
    gw.http
        .put(format!("{}/admin/faults", gw.base))
        .json(&json!({"timeout_after_commit_rate": 1.0, "hang_ms": 5000}))
        .send()
        .await
        .unwrap();
    let timed_out = gw
        .http
        .post(format!("{}/v1/charges", gw.base))
        .header("idempotency-key", "k")
        .json(&charge(order, 100, &gw.token("4242424242424242").await))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(timed_out.is_err(), "the client saw a timeout");
    assert_eq!(gw.ledger().await.len(), 1, "but the charge committed");
    let (s, replayed, _) = gw
        .post(
            "/v1/charges",
            "k",
            &charge(order, 100, &gw.token("4242424242424242").await),
        )
        .await;
    assert_eq!(
        (s, replayed),
        (201, true),
        "the retry gets the same charge back at once"
    );
    assert_eq!(gw.ledger().await.len(), 1);
    gw.stop().await;
}

#[tokio::test]
async fn the_served_openapi_document_is_the_committed_one() {
    let generated = mock_gateway::openapi_json();
    // A declined charge answers 402 with its ledger movement (stored under
    // the key like a success): an outcome, not a problem.
    testkit::openapi::check_committed(
        "mock-gateway",
        &generated,
        &["/v1/charges", "/v1/refunds", "/v1/ledger"],
        &["POST /v1/charges 402"],
    );
    let gw = Gateway::start(Default::default()).await;
    let served = gw
        .http
        .get(format!("{}/openapi.json", gw.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(served, generated);
    // The admin endpoints answer on the admin port only.
    for path in ["/openapi.json", "/metrics", "/health/ready", "/health/live"] {
        let public = gw.http.get(format!("{}{path}", gw.base)).send().await.unwrap();
        assert_eq!(public.status(), 404, "{path} on the public port");
        let admin = reqwest::get(format!("{}{path}", gw.admin)).await.unwrap();
        // Ready or not yet (the consumer may still be joining), but answered.
        assert_ne!(admin.status(), 404, "{path} on the admin port");
    }
    gw.stop().await;
}

#[tokio::test]
async fn one_token_per_card_and_charges_take_tokens_only() {
    let gw = Gateway::start(Default::default()).await;
    let a = gw.token("4242424242424242").await;
    assert!(a.starts_with("tok_"), "{a}");
    assert_eq!(gw.token("4242424242424242").await, a, "one token per card");
    assert_ne!(gw.token("5555555555554444").await, a);
    // A card number where a token belongs is refused, not charged.
    let (s, _, b) = gw
        .post("/v1/charges", "raw", &charge(Uuid::new_v4(), 500, "4242424242424242"))
        .await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["detail"], "unknown card token");
    // Not a card number: 422 problem+json.
    let r = gw
        .http
        .post(format!("{}/v1/tokens", gw.base))
        .json(&json!({"card": "42"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    gw.stop().await;
}

#[tokio::test]
async fn an_operation_is_looked_up_by_its_key_within_its_clients_scope() {
    let gw = Gateway::start(Default::default()).await;
    let order = Uuid::new_v4();
    let (_, _, charged) = gw
        .post(
            "/v1/charges",
            "charge-x",
            &charge(order, 700, &gw.token("4242424242424242").await),
        )
        .await;
    let (s, entry) = gw.get("/v1/operations/charge-x", "tests").await;
    assert_eq!(s, 200, "{entry}");
    assert_eq!(entry["id"], charged["id"]);
    assert_eq!(
        (entry["kind"].as_str(), entry["status"].as_str()),
        (Some("charge"), Some("captured"))
    );
    assert_eq!(entry["order_id"], order.to_string());
    // Another client's key space, and a key never used: 404 problem+json.
    let (s, _) = gw.get("/v1/operations/charge-x", "someone-else").await;
    assert_eq!(s, 404);
    // Naming the other client's scope without a grant: 403.
    let (s, problem) = gw.get("/v1/operations/charge-x?client=tests", "someone-else").await;
    assert_eq!(s, 403, "{problem}");
    let (s, problem) = gw.get("/v1/operations/never", "tests").await;
    assert_eq!(s, 404);
    assert_eq!(problem["status"], 404);
    gw.stop().await;
}

#[tokio::test]
async fn a_refused_refund_is_stored_under_its_key_and_a_new_key_can_succeed() {
    let gw = Gateway::start(mock_gateway::faults::Faults {
        refuse_refunds: true,
        ..Default::default()
    })
    .await;
    let order = Uuid::new_v4();
    gw.post(
        "/v1/charges",
        "c",
        &charge(order, 500, &gw.token("4242424242424242").await),
    )
    .await;
    let refund = json!({"order_id": order, "amount_cents": 500});
    let (s, _, b) = gw.post("/v1/refunds", "refund-1", &refund).await;
    assert_eq!(s, 422, "{b}");
    // The fault switched off, the same key still answers the refusal…
    let r = gw
        .http
        .put(format!("{}/admin/faults", gw.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (s, replayed, _) = gw.post("/v1/refunds", "refund-1", &refund).await;
    assert_eq!((s, replayed), (422, true));
    // …and a new attempt under a new key refunds.
    let (s, _, b) = gw.post("/v1/refunds", "refund-2", &refund).await;
    assert_eq!((s, b["status"].as_str()), (201, Some("refunded")));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_sights_of_one_card_get_one_token() {
    let gw = std::sync::Arc::new(Gateway::start(Default::default()).await);
    for round in 0..5 {
        let card = format!("42424242424200{round:02}");
        let tokens = futures::future::join_all((0..16).map(|_| {
            let (gw, card) = (gw.clone(), card.clone());
            async move { gw.token(&card).await }
        }))
        .await;
        assert!(tokens.iter().all(|t| t == &tokens[0]), "{tokens:?}");
    }
    std::sync::Arc::into_inner(gw).unwrap().stop().await;
}

/// Tokenising is rate-limited per caller: past the burst a 429 with
/// `Retry-After`, counted per caller; another caller is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenising_faster_than_allowed_is_refused_per_caller_and_counted() {
    const TOKENISE_PER_SEC: u32 = 2;
    let gw = Gateway::start_with(Default::default(), TOKENISE_PER_SEC).await;
    let limited = || telemetry::metrics::get("gateway_tokenise_limited_total", &[("caller", "tests")]);
    let before = limited();
    let mut statuses = std::collections::BTreeMap::new();
    let mut retry_after = None;
    for i in 0..(6 * TOKENISE_PER_SEC) {
        let r = gw
            .http
            .post(format!("{}/v1/tokens", gw.base))
            .json(&json!({ "card": format!("4000000000{i:06}") }))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 429 {
            retry_after = r.headers().get("retry-after").cloned();
        }
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    assert!(statuses.get(&429).copied().unwrap_or(0) > 0, "{statuses:?}");
    assert!(
        statuses.get(&201).copied().unwrap_or(0) >= 2 * TOKENISE_PER_SEC as usize,
        "the burst went through: {statuses:?}"
    );
    assert!(retry_after.is_some(), "a 429 says when to come back");
    assert_eq!(limited() - before, statuses[&429] as f64, "each refusal counted");
    let (status, _) = gw
        .post_as(
            "someone-else",
            "/v1/tokens",
            "k-other",
            &json!({ "card": "4242424242424242" }),
        )
        .await;
    assert_eq!(status, 201, "another caller is not held back");
    gw.stop().await;
}

/// A NUL where the gateway compares text (a card token, an operation's
/// key) is an unknown one — not a 500 from PostgreSQL, which cannot hold
/// it (the fuzzer's find).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_token_or_a_key_is_unknown_not_a_server_error() {
    let gw = Gateway::start(Default::default()).await;
    let body = json!({"order_id": uuid::Uuid::new_v4(), "amount_cents": 100, "card_token": "tok_\u{0}x"});
    let (status, _, problem) = gw.post("/v1/charges", "k-nul", &body).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["detail"], "unknown card token");
    let (status, _) = gw.get("/v1/operations/k%00ey", "tests").await;
    assert_eq!(status, 404);
    assert!(gw.ledger().await.is_empty(), "nothing written");
    gw.stop().await;
}
