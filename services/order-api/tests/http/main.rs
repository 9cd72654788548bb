//! order-api's HTTP layer against a real PostgreSQL (a fresh database per
//! test), served on port 0 in-process. The saga consumer is not started: these
//! tests are about what one request writes, and the outbox row it leaves.

mod idempotency;
mod openapi;

use std::net::SocketAddr;
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
}

impl TestApi {
    pub async fn start(ttl: Duration) -> Self {
        let db = TempDb::new("eo_http");
        let pool = order_api::connect(db.url(), 32).await.expect("database");
        let state = AppState {
            pool: pool.clone(),
            idempotency_ttl: ttl,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, order_api::http::router(state)).await });
        Self {
            addr,
            pool,
            http: reqwest::Client::new(),
            _db: db,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `POST path` with an Idempotency-Key and an optional client id.
    pub async fn post(&self, path: &str, key: &str, client: Option<&str>, body: &str) -> Reply {
        let mut req = self
            .http
            .post(self.url(path))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(c) = client {
            req = req.header("x-client-id", c);
        }
        let resp = req.send().await.expect("request");
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
