//! What order-api asks the payment gateway directly: a card's token (so no
//! card number is ever stored or sent on), and — when an order's payment is
//! overdue — what the gateway did under the operation's key. Charges and
//! refunds themselves are payment-service's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tracing::Instrument as _;

/// The gateway caller whose operations order-api's reconciliation reads
/// (payment-service's keys; the gateway grants order-api that read with
/// `GATEWAY_READERS=order-api=payment-service`).
pub const PAYMENT_CLIENT: &str = "payment-service";

/// Why the gateway gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Unreachable, timed out or 5xx: ask again later.
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
    /// It refused the request (4xx): asking again will not help.
    #[error("gateway refused: {0}")]
    Refused(String),
}

/// A card's token and last four digits.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct CardToken {
    /// `tok_…`.
    pub token: String,
    /// Last four digits of the number.
    pub last4: String,
}

/// A movement the gateway made, as its lookup shows it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Movement {
    /// The ledger entry id (the charge or refund id payment-service reports).
    pub id: String,
    /// `charge` or `refund`.
    pub kind: String,
    /// `captured`, `declined` or `refunded`.
    pub status: String,
}

#[derive(Serialize)]
struct TokenBody<'a> {
    card: &'a str,
}

/// Cards this process has tokenised, by the SHA-256 of the number: the
/// vault gives a card the same token every time, so a repeat card needs no
/// call (and `POST /orders` for it works while the vault is down). In memory
/// only, never stored; bounded by [`TOKEN_CACHE_SIZE`].
type TokenCache = Arc<Mutex<HashMap<[u8; 32], CardToken>>>;

/// Cards remembered per process before the cache starts over.
pub const TOKEN_CACHE_SIZE: usize = 10_000;

/// The gateway client.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    tokens: TokenCache,
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
            tokens: TokenCache::default(),
        })
    }

    /// The token of `card` (`POST /v1/tokens`, unless this process has
    /// tokenised the card before).
    pub async fn tokenise(&self, card: &str) -> Result<CardToken, Error> {
        let digest: [u8; 32] = Sha256::digest(card.as_bytes()).into();
        if let Some(known) = self.tokens.lock().expect("token cache").get(&digest) {
            return Ok(known.clone());
        }
        let req = self
            .http
            .post(format!("{}/v1/tokens", self.base))
            .json(&TokenBody { card });
        let (status, text) = self.send(req, "POST /v1/tokens").await?;
        let token: CardToken = match status {
            200..=299 => {
                serde_json::from_str(&text).map_err(|e| Error::Unavailable(format!("unreadable token: {e}")))?
            }
            _ => return Err(Error::Refused(format!("{status}: {text}"))),
        };
        let mut tokens = self.tokens.lock().expect("token cache");
        if tokens.len() >= TOKEN_CACHE_SIZE {
            tokens.clear();
        }
        tokens.insert(digest, token.clone());
        Ok(token)
    }

    /// What the gateway committed under payment-service's key `key`
    /// (`GET /v1/operations/{key}`): `None` when nothing was.
    pub async fn lookup(&self, key: &str) -> Result<Option<Movement>, Error> {
        let req = self
            .http
            .get(format!("{}/v1/operations/{key}", self.base))
            .query(&[("client", PAYMENT_CLIENT)]);
        let (status, text) = self.send(req, "GET /v1/operations/{key}").await?;
        match status {
            200 => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::Unavailable(format!("unreadable movement: {e}"))),
            404 => Ok(None),
            _ => Err(Error::Refused(format!("{status}: {text}"))),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder, route: &str) -> Result<(u16, String), Error> {
        let span = tracing::info_span!(
            "gateway.call",
            otel.name = %route,
            otel.kind = "client",
            http.response.status_code = tracing::field::Empty,
        );
        async {
            let mut headers = reqwest::header::HeaderMap::new();
            telemetry::propagation::inject_headers(&mut headers);
            let resp = req
                .headers(headers)
                .send()
                .await
                .map_err(|e| Error::Unavailable(e.to_string()))?;
            let status = resp.status().as_u16();
            tracing::Span::current().record("http.response.status_code", status);
            let text = resp.text().await.map_err(|e| Error::Unavailable(e.to_string()))?;
            if status >= 500 || status == 429 || status == 409 {
                return Err(Error::Unavailable(format!("{status}: {text}")));
            }
            Ok((status, text))
        }
        .instrument(span)
        .await
    }
}
