//! The payment gateway as its callers see it, in one place:
//!
//! - [`api`]: the wire types — requests, [`api::Movement`], [`api::Operation`],
//!   [`api::CardToken`] — with typed kinds and statuses. mock-gateway serves
//!   the same types (feature `server`: their OpenAPI schemas and database
//!   columns), so the two sides cannot drift apart;
//! - [`Client`]: every call order-api and payment-service make, each in a
//!   client span whose trace context goes along, with one set of rules for
//!   what an answer means ([`Error`]);
//! - `args` (feature `args`): `GatewayArgs`, the address, credential and
//!   timeout as a caller's typed settings.

pub mod api;
#[cfg(feature = "args")]
pub mod args;

#[cfg(feature = "args")]
pub use args::GatewayArgs;

use std::time::Duration;

use serde::de::DeserializeOwned;
use tracing::Instrument as _;

use api::{CardToken, ChargeRequest, Movement, NoticeRequest, Operation, RefundRequest, TokenRequest};

/// The metrics this client records, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "gateway_credential_refusals_total": "Gateway answers 401/403 to this service's credential (GATEWAY_API_KEY): orders wait, retried, until it is fixed.",
];

/// Why a call gave no definite answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Unreachable, timed out, 409 (the key in flight), 429 or 5xx — the
    /// outcome is unknown or temporary: ask again, with the same key.
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
    /// Refused for good (a 4xx the key stores: the same key always gets it).
    #[error("gateway refused: {0}")]
    Refused(String),
}

/// The gateway client: one credential, one timeout per request.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client for `base` presenting the bearer credential `key`, with a
    /// per-request `timeout`. Connections are kept alive and pooled.
    pub fn new(base: &str, key: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Self::build(base, key, timeout, reqwest::Client::builder())
    }

    /// [`Client::new`] trusting, for `https://`, only the certificate
    /// authorities `roots` — the gateway's own CA — not the system's.
    pub fn with_roots(
        base: &str,
        key: &str,
        timeout: Duration,
        roots: Vec<reqwest::Certificate>,
    ) -> Result<Self, reqwest::Error> {
        Self::build(base, key, timeout, reqwest::Client::builder().tls_certs_only(roots))
    }

    fn build(
        base: &str,
        key: &str,
        timeout: Duration,
        builder: reqwest::ClientBuilder,
    ) -> Result<Self, reqwest::Error> {
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .unwrap_or_else(|_| reqwest::header::HeaderValue::from_static("Bearer -"));
        auth.set_sensitive(true);
        let headers = reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, auth)]);
        Ok(Self {
            http: builder.default_headers(headers).timeout(timeout).build()?,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// The token of `card` (`POST /v1/tokens`).
    pub async fn tokenise(&self, card: &str) -> Result<CardToken, Error> {
        let req = self
            .http
            .post(self.url("/v1/tokens"))
            .json(&TokenRequest { card: card.into() });
        let (status, text) = self.send(req, "POST /v1/tokens").await?;
        match status {
            200..=299 => parse(&text),
            _ => Err(refused(status, &text)),
        }
    }

    /// Sends a notice (`POST /v1/notices`). The notifier takes no
    /// idempotency key: a call that reached it and whose answer was lost
    /// cannot be told from one that did not, and a second call is a second
    /// notice.
    pub async fn notify(&self, body: &NoticeRequest) -> Result<(), Error> {
        let req = self.http.post(self.url("/v1/notices")).json(body);
        let (status, text) = self.send(req, "POST /v1/notices").await?;
        match status {
            200..=299 => Ok(()),
            _ => Err(refused(status, &text)),
        }
    }

    /// Charges under `key` (`POST /v1/charges`): the movement, captured or
    /// declined (402). The same key always gets the same movement back.
    pub async fn charge(&self, key: &str, body: &ChargeRequest) -> Result<Movement, Error> {
        self.post_keyed("/v1/charges", key, body).await
    }

    /// Refunds under `key` (`POST /v1/refunds`).
    pub async fn refund(&self, key: &str, body: &RefundRequest) -> Result<Movement, Error> {
        self.post_keyed("/v1/refunds", key, body).await
    }

    /// What the gateway committed under `key` (`GET /v1/operations/{key}`) —
    /// of the caller `owner` when given (a read grant), else the caller's
    /// own: `None` when nothing was.
    pub async fn lookup(&self, key: &str, owner: Option<&str>) -> Result<Option<Operation>, Error> {
        let mut req = self.http.get(self.url(&format!("/v1/operations/{key}")));
        if let Some(owner) = owner {
            req = req.query(&[("client", owner)]);
        }
        let (status, text) = self.send(req, "GET /v1/operations/{key}").await?;
        match status {
            200 => parse(&text).map(Some),
            404 => Ok(None),
            _ => Err(refused(status, &text)),
        }
    }

    async fn post_keyed(&self, path: &'static str, key: &str, body: &impl serde::Serialize) -> Result<Movement, Error> {
        let req = self.http.post(self.url(path)).header("idempotency-key", key).json(body);
        let (status, text) = self.send(req, &format!("POST {path}")).await?;
        match status {
            // 402: declined by the issuer — a definite answer, stored under the key.
            200..=299 | 402 => parse(&text),
            // No such route: a wrong GATEWAY_URL, not an answer about the payment.
            404 => Err(Error::Unavailable(format!("404 for {path}: check GATEWAY_URL"))),
            _ => Err(refused(status, &text)),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends `req` in a client span (its trace context in the headers);
    /// answers that say "later" are [`Error::Unavailable`].
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
            // Our credential refused: a rotated or mistyped key, never an
            // answer about the payment — unavailable until it is fixed (the
            // order waits, retried; an alert says why), never a decline.
            if status == 401 || status == 403 {
                telemetry::metrics::incr("gateway_credential_refusals_total", &[("status", &status.to_string())]);
                tracing::error!(
                    status,
                    route,
                    "the gateway refused this service's credential: check GATEWAY_API_KEY"
                );
                return Err(Error::Unavailable(format!(
                    "{status}: the gateway refused this service's credential (GATEWAY_API_KEY): {text}"
                )));
            }
            Ok((status, text))
        }
        .instrument(span)
        .await
    }
}

fn parse<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|e| Error::Unavailable(format!("unreadable answer: {e}")))
}

fn refused(status: u16, text: &str) -> Error {
    Error::Refused(format!("{status}: {text}"))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::{Json, Router};

    use super::api::*;
    use super::*;

    /// A gateway that answers each route with a fixed status (the vault's
    /// as the charges').
    async fn gateway(charge: StatusCode, lookup: StatusCode) -> String {
        let movement = Movement {
            id: uuid::Uuid::nil(),
            status: EntryStatus::Declined,
        };
        let token = CardToken {
            token: "tok_x".into(),
            last4: "4242".into(),
        };
        let app = Router::new()
            .route("/v1/charges", post(move || async move { (charge, Json(movement)) }))
            .route("/v1/tokens", post(move || async move { (charge, Json(token)) }))
            .route(
                "/v1/operations/{key}",
                get(move || async move {
                    let op = Operation {
                        id: uuid::Uuid::nil(),
                        kind: EntryKind::Charge,
                        status: EntryStatus::Captured,
                    };
                    (lookup, Json(op))
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn charge() -> ChargeRequest {
        ChargeRequest {
            order_id: uuid::Uuid::nil(),
            amount_cents: 100,
            card_token: "tok_x".into(),
        }
    }

    #[tokio::test]
    async fn a_decline_is_an_answer_a_conflict_is_later_and_a_4xx_is_refused() {
        let c = Client::new(
            &gateway(StatusCode::PAYMENT_REQUIRED, StatusCode::OK).await,
            "k",
            Duration::from_secs(5),
        )
        .unwrap();
        let m = c.charge("key-1", &charge()).await.unwrap();
        assert_eq!(m.status, EntryStatus::Declined);
        let op = c.lookup("key-1", Some("payment-service")).await.unwrap().unwrap();
        assert_eq!((op.kind, op.status), (EntryKind::Charge, EntryStatus::Captured));

        let c = Client::new(
            &gateway(StatusCode::CONFLICT, StatusCode::NOT_FOUND).await,
            "k",
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(matches!(c.charge("key-1", &charge()).await, Err(Error::Unavailable(_))));
        assert!(c.lookup("key-1", None).await.unwrap().is_none());

        let c = Client::new(
            &gateway(StatusCode::UNPROCESSABLE_ENTITY, StatusCode::BAD_REQUEST).await,
            "k",
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(matches!(c.charge("key-1", &charge()).await, Err(Error::Refused(_))));
        assert!(matches!(c.lookup("key-1", None).await, Err(Error::Refused(_))));
    }

    /// A refused credential (a rotated or mistyped key) and a missing route
    /// (a wrong URL) say nothing about the payment: unavailable — the
    /// order waits and is retried — never a refusal that declines it.
    #[tokio::test]
    async fn a_refused_credential_or_a_missing_route_is_unavailable_never_a_refusal() {
        for (charge_status, lookup_status) in [
            (StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED),
            (StatusCode::FORBIDDEN, StatusCode::FORBIDDEN),
        ] {
            let c = Client::new(
                &gateway(charge_status, lookup_status).await,
                "k",
                Duration::from_secs(5),
            )
            .unwrap();
            let charged = c.charge("key-1", &charge()).await;
            assert!(
                matches!(&charged, Err(Error::Unavailable(m)) if m.contains("GATEWAY_API_KEY")),
                "{charged:?}"
            );
            assert!(matches!(c.lookup("key-1", None).await, Err(Error::Unavailable(_))));
            assert!(matches!(
                c.tokenise("4242424242424242").await,
                Err(Error::Unavailable(_))
            ));
        }
        let c = Client::new(
            &gateway(StatusCode::NOT_FOUND, StatusCode::OK).await,
            "k",
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(matches!(c.charge("key-1", &charge()).await, Err(Error::Unavailable(_))));
    }

    #[tokio::test]
    async fn an_unreachable_gateway_is_unavailable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Client::new(&format!("http://127.0.0.1:{port}"), "k", Duration::from_secs(2)).unwrap();
        assert!(matches!(
            c.tokenise("4242424242424242").await,
            Err(Error::Unavailable(_))
        ));
    }
}
