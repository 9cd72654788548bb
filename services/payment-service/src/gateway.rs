//! HTTP client of the payment gateway. Every call carries the operation's
//! Idempotency-Key; the caller decides what a failure means.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::Instrument as _;
use uuid::Uuid;

/// The gateway's answer to a charge or refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Captured or refunded; the gateway's entry id.
    Done(String),
    /// Declined by the issuer.
    Declined(String),
    /// Refused for good (a 4xx the key stores: the same key always gets it).
    Refused(String),
}

/// Why a call did not produce a definite answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Timeout, connection error, 409 in flight, 5xx: the outcome is unknown
    /// or temporary — retry with the same key.
    #[error("gateway call must be retried: {0}")]
    Retry(String),
    /// The gateway refused the request for good (4xx other than 402/409).
    #[error("gateway refused: {0}")]
    Refused(String),
}

#[derive(Serialize)]
struct ChargeBody<'a> {
    order_id: Uuid,
    amount_cents: i64,
    card_token: &'a str,
}

#[derive(Serialize)]
struct RefundBody {
    order_id: Uuid,
    amount_cents: i64,
}

#[derive(Deserialize)]
struct Movement {
    id: String,
    status: String,
}

/// The gateway client.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client for `base` presenting credential `key`, with a per-request
    /// `timeout`.
    pub fn new(base: &str, key: &service_kit::Secret, timeout: Duration) -> anyhow::Result<Self> {
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose()))?;
        auth.set_sensitive(true);
        let headers = reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, auth)]);
        Ok(Self {
            http: reqwest::Client::builder()
                .default_headers(headers)
                .timeout(timeout)
                .build()?,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Charges `amount_cents` on the card of `card_token` for `order_id` under `key`.
    pub async fn charge(
        &self,
        key: &str,
        order_id: Uuid,
        amount_cents: i64,
        card_token: &str,
    ) -> Result<Reply, CallError> {
        self.post(
            "/v1/charges",
            key,
            &ChargeBody {
                order_id,
                amount_cents,
                card_token,
            },
        )
        .await
    }

    /// What the gateway committed under `key` (`GET /v1/operations/{key}`):
    /// `None` when nothing was.
    pub async fn lookup(&self, key: &str) -> Result<Option<Reply>, CallError> {
        #[derive(Deserialize)]
        struct Entry {
            id: String,
            status: String,
        }
        let resp = self
            .http
            .get(format!("{}/v1/operations/{key}", self.base))
            .send()
            .await
            .map_err(|e| CallError::Retry(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| CallError::Retry(e.to_string()))?;
        match status {
            200 => {
                let e: Entry =
                    serde_json::from_str(&text).map_err(|e| CallError::Retry(format!("unreadable entry: {e}")))?;
                Ok(Some(if e.status == "declined" {
                    Reply::Declined(e.id)
                } else {
                    Reply::Done(e.id)
                }))
            }
            404 => Ok(None),
            _ => Err(CallError::Retry(format!("{status}: {text}"))),
        }
    }

    /// Refunds `amount_cents` of `order_id`'s charge under `key`.
    pub async fn refund(&self, key: &str, order_id: Uuid, amount_cents: i64) -> Result<Reply, CallError> {
        self.post("/v1/refunds", key, &RefundBody { order_id, amount_cents })
            .await
    }

    async fn post(&self, path: &str, key: &str, body: &impl Serialize) -> Result<Reply, CallError> {
        let span = tracing::info_span!(
            "gateway.call",
            otel.name = %format_args!("POST {path}"),
            otel.kind = "client",
            http.request.method = "POST",
            url.path = %path,
            http.response.status_code = tracing::field::Empty,
        );
        let resp = async {
            // The gateway's server span becomes a child of this client span.
            let mut headers = reqwest::header::HeaderMap::new();
            telemetry::propagation::inject_headers(&mut headers);
            self.http
                .post(format!("{}{path}", self.base))
                .headers(headers)
                .header("idempotency-key", key)
                .json(body)
                .send()
                .await
        }
        .instrument(span.clone())
        .await
        .map_err(|e| CallError::Retry(e.to_string()))?;
        span.record("http.response.status_code", resp.status().as_u16());
        let status = resp.status();
        let text = resp.text().await.map_err(|e| CallError::Retry(e.to_string()))?;
        match status.as_u16() {
            200..=299 | 402 => {
                let m: Movement =
                    serde_json::from_str(&text).map_err(|e| CallError::Retry(format!("unreadable reply: {e}")))?;
                Ok(if m.status == "declined" {
                    Reply::Declined(m.id)
                } else {
                    Reply::Done(m.id)
                })
            }
            409 | 429 | 500..=599 => Err(CallError::Retry(format!("{status}: {text}"))),
            _ => Err(CallError::Refused(format!("{status}: {text}"))),
        }
    }
}
