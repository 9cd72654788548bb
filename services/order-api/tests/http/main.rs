//! order-api's HTTP layer against a real PostgreSQL (a fresh database per
//! test): the service as its binary starts it (`order_api::build` on port 0,
//! then `App::run`), in-process, with a local gateway and the test binary's
//! shared broker (`testkit::broker::shared`). No relay runs: these tests are
//! about what one request writes, and the outbox row it leaves there.

mod admission;
mod auth;
mod cards;
mod idempotency;
mod openapi;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser as _;
use sqlx::PgPool;
use testkit::TempDb;

/// A running API on a fresh database.
pub struct TestApi {
    pub addr: SocketAddr,
    /// The admin endpoints (health, metrics, the API's description).
    pub admin: SocketAddr,
    pub pool: PgPool,
    pub http: reqwest::Client,
    /// Dropped with this value, also when the test panics.
    _db: TempDb,
    /// The card vault's database.
    _gateway_db: TempDb,
    /// Stops the gateway (a test may stop it alone).
    gateway: tokio_util::sync::CancellationToken,
    /// Stops the API.
    service: tokio_util::sync::CancellationToken,
    /// API keys by client, provisioned on first use.
    keys: Mutex<HashMap<String, String>>,
    /// The API's authentication (its lookup count).
    pub auth: std::sync::Arc<order_api::auth::Auth>,
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.service.cancel();
        self.gateway.cancel();
    }
}

impl TestApi {
    /// `ttl`: the Idempotency-Key lifetime, in whole seconds (the service's setting).
    pub async fn start(ttl: Duration) -> Self {
        Self::start_with(ttl, order_api::auth::AuthArgs::default()).await
    }

    pub async fn start_with(ttl: Duration, limits: order_api::auth::AuthArgs) -> Self {
        Self::start_configured(ttl, |config| config.auth = limits).await
    }

    /// A test API whose configuration `configure` changes last.
    pub async fn start_configured(ttl: Duration, configure: impl FnOnce(&mut order_api::Config)) -> Self {
        let db = TempDb::new("eo_http");
        let gateway_db = TempDb::new("eo_http_gw");
        let (token, service) = (
            tokio_util::sync::CancellationToken::new(),
            tokio_util::sync::CancellationToken::new(),
        );
        let gateway = mock_gateway::start_local(gateway_db.url(), token.clone())
            .await
            .expect("gateway");
        let brokers = testkit::broker::shared().await.expect("broker");
        let ttl = ttl.as_secs().to_string();
        let mut config = order_api::Config::try_parse_from([
            "order-api",
            "--database-url",
            db.url(),
            "--kafka-brokers",
            &brokers,
            // The binary's shared test broker is a plaintext one.
            "--kafka-plaintext",
            "--http-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--gateway-url",
            &gateway.url,
            // The in-process gateway serves plain HTTP on loopback.
            "--gateway-allow-plaintext",
            "--gateway-api-key",
            gateway.order_api_key.expose(),
            "--gateway-timeout-ms",
            "5000",
            "--idempotency-ttl-secs",
            &ttl,
            "--idempotency-fingerprint-key",
            mock_gateway::random_secret().expose(),
            "--operator-key",
            mock_gateway::random_secret().expose(),
        ])
        .expect("configuration");
        configure(&mut config);
        let app = order_api::build(config).await.expect("order-api");
        let (addr, admin) = (app.local_addr(), app.admin_addr());
        let (pool, auth) = (app.state().pool.clone(), app.state().auth.clone());
        tokio::spawn(app.run(service.clone()));
        Self {
            addr,
            admin,
            pool,
            http: reqwest::Client::new(),
            _db: db,
            _gateway_db: gateway_db,
            gateway: token,
            service,
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
