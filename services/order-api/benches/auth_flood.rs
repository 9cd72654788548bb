//! A flood of bad API keys against order-api over real HTTP and a real
//! PostgreSQL: how many key lookups reach the database per request, and
//! how many requests a second the API answers, with the guards (a negative
//! cache of unknown keys, a per-address lookup allowance) and without them.
//!
//! `cargo bench -p order-api --bench auth_flood`
//!
//! Two floods per configuration, `REQUESTS` requests each from
//! `CONCURRENCY` clients on one address: one bad key repeated, and a fresh
//! random bad key per request (which no cache can catch). Goal: well under
//! 0.01 lookups per request with the guards; the ceiling is the unguarded
//! run of the same flood (one lookup per request). Results go to stdout and
//! `target/bench-results/auth-flood.json`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use order_api::auth::{Auth, AuthArgs};
use order_api::AppState;

const CONCURRENCY: usize = 32;
const REQUESTS: usize = 20_000;

#[derive(Debug, serde::Serialize)]
struct Flood {
    guards: bool,
    keys: &'static str,
    requests: usize,
    lookups: u64,
    lookups_per_request: f64,
    requests_per_sec: f64,
    statuses: std::collections::BTreeMap<u16, usize>,
}

async fn flood(base: &str, auth: &Arc<Auth>, guards: bool, fresh_keys: bool) -> Flood {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()
        .unwrap();
    let before = auth.lookups_made();
    let started = Instant::now();
    let statuses: Vec<u16> = futures::stream::iter(0..REQUESTS)
        .map(|i| {
            let key = if fresh_keys {
                format!("eo_{}", uuid::Uuid::new_v4().simple())
            } else {
                "eo_the_same_bad_key".to_owned()
            };
            let req = http
                .get(format!("{base}/orders/00000000-0000-0000-0000-000000000000"))
                .bearer_auth(key);
            let _ = i;
            async move { req.send().await.map(|r| r.status().as_u16()).unwrap_or(0) }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let lookups = auth.lookups_made() - before;
    let mut counts = std::collections::BTreeMap::new();
    for s in statuses {
        *counts.entry(s).or_default() += 1;
    }
    Flood {
        guards,
        keys: if fresh_keys {
            "a fresh key per request"
        } else {
            "one key repeated"
        },
        requests: REQUESTS,
        lookups,
        lookups_per_request: lookups as f64 / REQUESTS as f64,
        requests_per_sec: REQUESTS as f64 / elapsed,
        statuses: counts,
    }
}

async fn serve(pool: &sqlx::PgPool, gateway: &mock_gateway::LocalGateway, args: AuthArgs) -> (String, Arc<Auth>) {
    let auth = Auth::new(pool.clone(), args);
    let state = AppState {
        pool: pool.clone(),
        idempotency_ttl: Duration::from_secs(86_400),
        gateway: order_api::gateway::Client::new(&gateway.url, &gateway.order_api_key, Duration::from_secs(5)).unwrap(),
        auth: auth.clone(),
        fingerprint_key: idempotency::FingerprintKey::for_tests(),
        // This bench measures its own subject, not admission control.
        admission: order_api::http::admission::Admission::new(&order_api::http::admission::AdmissionArgs {
            max_in_flight: 100_000,
            deadline_ms: 600_000,
        }),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = order_api::http::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, auth)
}

#[tokio::main]
async fn main() {
    let db = testkit::TempDb::new("eo_bench_flood");
    let pool = order_api::connect(db.url(), 16).await.expect("database");
    let gateway_db = testkit::TempDb::new("eo_bench_flood_gw");
    let gateway = mock_gateway::start_local(gateway_db.url(), Default::default())
        .await
        .expect("gateway");
    let unguarded = AuthArgs {
        key_cache_secs: 0,
        lookups_per_sec: f64::INFINITY,
        ..AuthArgs::default()
    };
    let mut rows = Vec::new();
    for (guards, args) in [(false, unguarded), (true, AuthArgs::default())] {
        let (base, auth) = serve(&pool, &gateway, args).await;
        for fresh in [false, true] {
            let f = flood(&base, &auth, guards, fresh).await;
            println!(
                "guards {:<5} {:<24} {:>6} requests → {:>6} lookups ({:.4} per request), {:>6.0} req/s, statuses {:?}",
                f.guards, f.keys, f.requests, f.lookups, f.lookups_per_request, f.requests_per_sec, f.statuses
            );
            rows.push(f);
        }
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-results");
    std::fs::create_dir_all(&dir).ok();
    std::fs::write(
        dir.join("auth-flood.json"),
        serde_json::to_vec_pretty(
            &serde_json::json!({"bench": "auth_flood", "concurrency": CONCURRENCY, "floods": rows}),
        )
        .unwrap(),
    )
    .ok();
    pool.close().await;
    drop(db);
    drop(gateway_db);
}
