//! A client of the public HTTP APIs, used like real clients use them:
//! every write carries an Idempotency-Key, and a retry reuses it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use crate::stack::{Service, Stack};

/// The card the mock gateway always declines.
pub const DECLINED_CARD: &str = "4000000000000002";
/// A card that is always captured.
pub const GOOD_CARD: &str = "4242424242424242";

/// A new order.
#[derive(Debug, Clone, Serialize)]
pub struct OrderRequest {
    /// SKU.
    pub sku: String,
    /// Units.
    pub quantity: i32,
    /// Amount in cents.
    pub amount_cents: i64,
    /// Card.
    pub card: String,
}

/// An order as returned by the API.
#[derive(Debug, Clone, Deserialize)]
pub struct OrderView {
    /// Id.
    pub id: Uuid,
    /// Saga status.
    pub status: String,
    /// SKU.
    pub sku: String,
    /// Units.
    pub quantity: i32,
    /// Amount.
    pub amount_cents: i64,
    /// Cancel reason, if cancelled.
    pub cancel_reason: Option<String>,
}

/// Result of a POST.
#[derive(Debug, Clone)]
pub struct Posted {
    /// HTTP status.
    pub status: u16,
    /// Whether the server said it replayed a stored response.
    pub replayed: bool,
    /// Body.
    pub body: String,
}

/// The API client.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    orders: String,
    inventory: String,
    gateway: String,
    /// The client's API key (`Authorization: Bearer`).
    pub api_key: String,
    /// inventory's operator credential (seeding and reading stock).
    operator_key: String,
    /// A gateway caller's credential (payment-service's: the fault switch).
    gateway_key: String,
}

impl Client {
    /// A client for `stack`'s services.
    pub fn new(stack: &Stack, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            http: stack.http_client(timeout)?,
            orders: stack.url(Service::OrderApi),
            inventory: stack.url(Service::Inventory),
            gateway: stack.url(Service::Gateway),
            api_key: stack.api_key().to_owned(),
            operator_key: stack.secrets().operator.clone(),
            gateway_key: stack.secrets().payment_gateway.clone(),
        })
    }

    /// `POST /orders` once with `key`.
    pub async fn post_order(&self, key: &str, order: &OrderRequest) -> reqwest::Result<Posted> {
        self.post(&format!("{}/orders", self.orders), key, &json!(order)).await
    }

    /// `POST /orders/{id}/cancel` once with `key`.
    pub async fn cancel(&self, key: &str, id: Uuid) -> reqwest::Result<Posted> {
        self.post(&format!("{}/orders/{id}/cancel", self.orders), key, &json!({}))
            .await
    }

    async fn post(&self, url: &str, key: &str, body: &serde_json::Value) -> reqwest::Result<Posted> {
        let resp = self
            .http
            .post(url)
            .header("idempotency-key", key)
            .bearer_auth(&self.api_key)
            .json(body)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let replayed = resp.headers().get("idempotent-replayed").is_some();
        Ok(Posted {
            status,
            replayed,
            body: resp.text().await?,
        })
    }

    /// Places an order, retrying with the **same** key on timeouts, 409 and
    /// 5xx, as a careful client does. Returns the created order.
    pub async fn place_order(&self, key: &str, order: &OrderRequest, deadline: Duration) -> anyhow::Result<OrderView> {
        let end = Instant::now() + deadline;
        loop {
            match self.post_order(key, order).await {
                Ok(p) if p.status == 201 => return Ok(serde_json::from_str(&p.body)?),
                Ok(p) if p.status == 409 || p.status >= 500 => {}
                Ok(p) => anyhow::bail!("order rejected: {} {}", p.status, p.body),
                Err(_) => {}
            }
            anyhow::ensure!(
                Instant::now() < end,
                "order with key {key} not acknowledged in {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Places an order ([`Self::place_order`]) and waits until it is
    /// terminal ([`Self::wait_terminal`], 60 s); returns it as it ended.
    pub async fn place_and_settle(&self, key: &str, order: &OrderRequest) -> anyhow::Result<OrderView> {
        let placed = self.place_order(key, order, Duration::from_secs(10)).await?;
        let mut done = self.wait_terminal(&[placed.id], Duration::from_secs(60)).await?;
        done.remove(&placed.id).context("the placed order")
    }

    /// `GET /orders/{id}`.
    pub async fn order(&self, id: Uuid) -> anyhow::Result<OrderView> {
        Ok(self
            .http
            .get(format!("{}/orders/{id}", self.orders))
            .bearer_auth(&self.api_key)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// Waits until order `id` is terminal; its status (CONFIRMED or CANCELLED).
    pub async fn final_status(&self, id: Uuid, timeout: Duration) -> anyhow::Result<String> {
        let mut finals = self.wait_terminal(&[id], timeout).await?;
        Ok(finals.remove(&id).expect("waited for it").status)
    }

    /// Places `order` under a new key and waits until it is terminal: its id and status.
    pub async fn place_and_finish(&self, order: &OrderRequest, timeout: Duration) -> anyhow::Result<(Uuid, String)> {
        let placed = self.place_order(&new_key(), order, Duration::from_secs(10)).await?;
        Ok((placed.id, self.final_status(placed.id, timeout).await?))
    }

    /// Waits until every order in `ids` is terminal (CONFIRMED or CANCELLED,
    /// and not mid-cancel); returns them, or the stragglers' states on timeout.
    pub async fn wait_terminal(&self, ids: &[Uuid], timeout: Duration) -> anyhow::Result<BTreeMap<Uuid, OrderView>> {
        let end = Instant::now() + timeout;
        let mut done = BTreeMap::new();
        loop {
            for id in ids {
                if done.contains_key(id) {
                    continue;
                }
                if let Ok(o) = self.order(*id).await {
                    if o.status == "CONFIRMED" || o.status == "CANCELLED" {
                        done.insert(*id, o);
                    }
                }
            }
            if done.len() == ids.len() {
                return Ok(done);
            }
            if Instant::now() > end {
                let stuck: Vec<_> = ids.iter().filter(|i| !done.contains_key(i)).take(10).collect();
                anyhow::bail!(
                    "{} of {} orders not terminal after {timeout:?}, e.g. {stuck:?}",
                    ids.len() - done.len(),
                    ids.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Sets a SKU's available stock.
    pub async fn seed_stock(&self, sku: &str, available: i32) -> anyhow::Result<()> {
        self.http
            .put(format!("{}/stock/{sku}", self.inventory))
            .bearer_auth(&self.operator_key)
            .json(&json!({ "available": available }))
            .send()
            .await?
            .error_for_status()
            .with_context(|| format!("seeding {sku}"))?;
        Ok(())
    }

    /// Stock per SKU: (available, reserved).
    pub async fn stock(&self) -> anyhow::Result<BTreeMap<String, (i64, i64)>> {
        #[derive(Deserialize)]
        struct Level {
            sku: String,
            available: i64,
            reserved: i64,
        }
        let levels: Vec<Level> = self
            .http
            .get(format!("{}/stock", self.inventory))
            .bearer_auth(&self.operator_key)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(levels.into_iter().map(|l| (l.sku, (l.available, l.reserved))).collect())
    }

    /// Sets the gateway's faults (its admin endpoint must be enabled).
    pub async fn set_gateway_faults(&self, faults: serde_json::Value) -> anyhow::Result<()> {
        self.http
            .put(format!("{}/admin/faults", self.gateway))
            .bearer_auth(&self.gateway_key)
            .json(&faults)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    Uuid::new_v4().to_string()
}
