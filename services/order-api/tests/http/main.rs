//! order-api's HTTP layer against a real PostgreSQL (a fresh database per
//! test), served on port 0 in-process. The saga consumer is not started: these
//! tests are about what one request writes, and the outbox row it leaves.

mod auth;
mod cards;
mod idempotency;
mod openapi;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use order_api::AppState;
use sqlx::PgPool;
use testkit::TempDb;

/// A running API on a fresh database.
pub struct TestApi {
    pub addr: SocketAddr,
    pub pool: PgPool,
    pub http: reqwest::Client,
    /// Dropped with this value, also when the test panics.
    _db: TempDb,
    /// The card vault's database.
    _gateway_db: TempDb,
    gateway: tokio_util::sync::CancellationToken,
    /// API keys by client, provisioned on first use.
    keys: Mutex<HashMap<String, String>>,
    /// The API's authentication (its lookup count).
    pub auth: std::sync::Arc<order_api::auth::Auth>,
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.gateway.cancel();
    }
}

impl TestApi {
    pub async fn start(ttl: Duration) -> Self {
        Self::start_with(ttl, order_api::auth::AuthArgs::default()).await
    }

    pub async fn start_with(ttl: Duration, limits: order_api::auth::AuthArgs) -> Self {
        let db = TempDb::new("eo_http");
        let pool = order_api::connect(db.url(), 32).await.expect("database");
        let gateway_db = TempDb::new("eo_http_gw");
        let gateway = tokio_util::sync::CancellationToken::new();
        let gateway_url = mock_gateway::start_local(gateway_db.url(), gateway.clone())
            .await
            .expect("gateway");
        let state = AppState {
            pool: pool.clone(),
            idempotency_ttl: ttl,
            gateway: order_api::gateway::Client::new(
                &gateway_url.url,
                &gateway_url.order_api_key,
                Duration::from_secs(5),
            )
            .unwrap(),
            auth: order_api::auth::Auth::new(pool.clone(), limits),
            fingerprint_key: ::idempotency::FingerprintKey::for_tests(),
        };
        let auth = state.auth.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = order_api::http::router(state).into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            pool,
            http: reqwest::Client::new(),
            _db: db,
            _gateway_db: gateway_db,
            gateway,
            keys: Mutex::default(),
            auth,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The API key of `client` (provisioned on first use).
    pub async fn key(&self, client: &str) -> String {
        if let Some(k) = self.keys.lock().unwrap().get(client) {
            return k.clone();
        }
        let (_, key) = order_api::auth::create_key(&self.pool, client).await.unwrap();
        self.keys.lock().unwrap().insert(client.to_owned(), key.clone());
        key
    }

    /// `POST path` with an Idempotency-Key as `client` (default `test-client`).
    pub async fn post(&self, path: &str, key: &str, client: Option<&str>, body: &str) -> Reply {
        let bearer = self.key(client.unwrap_or("test-client")).await;
        let req = self
            .http
            .post(self.url(path))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .bearer_auth(bearer)
            .body(body.to_owned());
        Reply::of(req.send().await.expect("request")).await
    }

    /// `GET path` as `client`.
    pub async fn get(&self, path: &str, client: &str) -> Reply {
        let bearer = self.key(client).await;
        Reply::of(
            self.http
                .get(self.url(path))
                .bearer_auth(bearer)
                .send()
                .await
                .expect("request"),
        )
        .await
    }
}

impl Reply {
    pub async fn of(resp: reqwest::Response) -> Self {
        Reply {
            status: resp.status().as_u16(),
            replayed: resp.headers().get("idempotent-replayed").is_some(),
            retry_after: resp.headers().get("retry-after").is_some(),
            content_type: resp
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned()),
            body: resp.bytes().await.unwrap().to_vec(),
        }
    }
}

impl TestApi {
    /// (orders, outbox rows, idempotency keys)
    pub async fn counts(&self) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox), (SELECT count(*) FROM idempotency_keys)",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn stop(self) {
        // The database goes with `_db`.
        self.pool.close().await;
    }
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: bool,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

pub const ORDER: &str = r#"{"sku":"WIDGET","quantity":2,"amount_cents":2500,"card":"4242424242424242"}"#;
