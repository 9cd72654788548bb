//! POST /orders with a fresh Idempotency-Key vs a replayed key vs the same
//! insert (order + outbox row in one transaction) without the idempotency
//! layer, over real HTTP against a real PostgreSQL.
//!
//! `cargo bench -p order-api --bench idempotency`
//!
//! Latency is measured with one client (no queueing), throughput with
//! `CONCURRENCY` clients, in `ROUNDS` rounds that take the modes in turn
//! (PostgreSQL's speed drifts with checkpoints and table growth); figures are
//! per-mode medians and the fresh-key cost is the median of the rounds'
//! paired costs. Results go to stdout and `target/bench-results/`.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use contract::Message;
use order_api::orders::{self, NewOrder};
use order_api::AppState;

const CONCURRENCY: usize = 8;
const ROUNDS: usize = 5;
const LATENCY_REQUESTS: usize = 2_000;
const THROUGHPUT_REQUESTS: usize = 4_000;
const BODY: &str = r#"{"sku":"WIDGET","quantity":2,"amount_cents":2500,"card":"4242424242424242"}"#;

/// The baseline: what POST /orders does, minus the idempotency layer.
async fn plain_insert(State(state): State<AppState>, Json(body): Json<serde_json::Value>) -> StatusCode {
    // The same card vault call as POST /orders makes, so the two differ by
    // the idempotency layer only.
    let token = state.gateway.tokenise(body["card"].as_str().unwrap()).await.unwrap();
    let new = NewOrder {
        sku: body["sku"].as_str().unwrap().to_owned(),
        quantity: body["quantity"].as_i64().unwrap() as i32,
        amount_cents: body["amount_cents"].as_i64().unwrap(),
        card_token: token.token,
        card_last4: token.last4,
    };
    let mut tx = state.pool.begin().await.unwrap();
    let order = orders::insert(&mut tx, "bench", &new).await.unwrap();
    let first = Message::ReserveStock {
        sku: order.sku.clone(),
        quantity: order.quantity,
    };
    saga_kit::emit::emit(&mut tx, order.id, &first, None).await.unwrap();
    tx.commit().await.unwrap();
    StatusCode::CREATED
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Fresh,
    Replay,
    Plain,
}

async fn one(http: &reqwest::Client, base: &str, mode: Mode, i: usize) -> Duration {
    let (path, key) = match mode {
        Mode::Fresh => ("/orders", uuid::Uuid::new_v4().to_string()),
        Mode::Replay => ("/orders", "replayed-key".to_owned()),
        Mode::Plain => ("/plain-orders", String::new()),
    };
    let start = Instant::now();
    let mut req = http
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(BODY);
    if !key.is_empty() {
        req = req.header("idempotency-key", key);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{mode:?} #{i}");
    resp.bytes().await.unwrap();
    start.elapsed()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    rps: f64,
}

async fn measure(http: &reqwest::Client, base: &str, mode: Mode) -> Figures {
    let mut lat = Vec::with_capacity(LATENCY_REQUESTS);
    for i in 0..LATENCY_REQUESTS {
        lat.push(one(http, base, mode, i).await);
    }
    lat.sort();
    let start = Instant::now();
    let per = THROUGHPUT_REQUESTS / CONCURRENCY;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (http, base) = (http.clone(), base.to_owned());
            tokio::spawn(async move {
                for i in 0..per {
                    one(&http, &base, mode, i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let rps = (per * CONCURRENCY) as f64 / start.elapsed().as_secs_f64();
    Figures {
        p50_ms: pct(&lat, 0.50),
        p99_ms: pct(&lat, 0.99),
        rps,
    }
}

#[tokio::main]
async fn main() {
    let db = testkit::TempDb::new("eo_bench_idem");
    let pool = order_api::connect(db.url(), 16).await.expect("database");
    let gateway_db = testkit::TempDb::new("eo_bench_idem_gw");
    let gateway_url = mock_gateway::start_local(gateway_db.url(), Default::default())
        .await
        .expect("gateway");
    let state = AppState {
        pool: pool.clone(),
        idempotency_ttl: Duration::from_secs(86_400),
        gateway: order_api::gateway::Client::new(&gateway_url.url, &gateway_url.order_api_key, Duration::from_secs(5))
            .unwrap(),
        auth: order_api::auth::Auth::new(pool.clone(), Default::default()),
        fingerprint_key: idempotency::FingerprintKey::for_tests(),
        // This bench measures its own subject, not admission control.
        admission: order_api::http::admission::Admission::new(&order_api::http::admission::AdmissionArgs {
            max_in_flight: 100_000,
            deadline_ms: 600_000,
        }),
    };
    let app: Router = order_api::http::router(state.clone()).merge(
        Router::new()
            .route("/plain-orders", post(plain_insert))
            .with_state(state),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    // `/orders` takes an API key (the baseline route has no auth layer).
    let (_, api_key) = order_api::auth::create_key(&pool, "bench").await.expect("an API key");
    let mut auth = reqwest::header::HeaderMap::new();
    auth.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {api_key}").parse().expect("a header value"),
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .default_headers(auth)
        .build()
        .unwrap();

    // Warm every path (connections, plans, table growth) before measuring.
    for i in 0..500 {
        for mode in [Mode::Plain, Mode::Fresh, Mode::Replay] {
            one(&http, &base, mode, i).await;
        }
    }
    let modes = [Mode::Plain, Mode::Fresh, Mode::Replay];
    let mut runs: Vec<Vec<Figures>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for k in 0..modes.len() {
            let m = (round + k) % modes.len();
            runs[m].push(measure(&http, &base, modes[m]).await);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rows: Vec<(Mode, Figures)> = modes
        .iter()
        .zip(&runs)
        .map(|(mode, r)| {
            let f = Figures {
                p50_ms: median(r.iter().map(|f| f.p50_ms).collect()),
                p99_ms: median(r.iter().map(|f| f.p99_ms).collect()),
                rps: median(r.iter().map(|f| f.rps).collect()),
            };
            println!(
                "{:<8} p50 {:>6.3} ms  p99 {:>6.3} ms  {:>7.0} req/s ({} clients; medians of {ROUNDS} rounds)",
                format!("{mode:?}"),
                f.p50_ms,
                f.p99_ms,
                f.rps,
                CONCURRENCY
            );
            (*mode, f)
        })
        .collect();
    let costs: Vec<f64> = (0..ROUNDS)
        .map(|i| (1.0 - runs[1][i].rps / runs[0][i].rps) * 100.0)
        .collect();
    let cost = median(costs.clone());
    let shown: Vec<String> = costs.iter().map(|c| format!("{c:.1}")).collect();
    println!(
        "fresh-key throughput cost vs plain insert: {cost:.1} % (goal ≤ 15 %; median of rounds {} %)",
        shown.join(" / ")
    );
    println!("replay p50: {:.3} ms (goal ≤ 1 ms)", rows[2].1.p50_ms);
    let json = serde_json::json!({
        "bench": "idempotency",
        "concurrency": CONCURRENCY,
        "modes": rows.iter().map(|(m, f)| serde_json::json!({"mode": format!("{m:?}"), "p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "rps": f.rps})).collect::<Vec<_>>(),
        "rounds": ROUNDS,
        "fresh_cost_percent": cost,
        "fresh_cost_percent_per_round": costs,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results");
    std::fs::create_dir_all(&dir).ok();
    std::fs::write(dir.join("idempotency.json"), serde_json::to_vec_pretty(&json).unwrap()).ok();
    pool.close().await;
    drop(db);
}
