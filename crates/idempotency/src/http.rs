//! The axum adapter: one way for every HTTP API here (order-api and the
//! mock gateway) to put a handler under `Idempotency-Key`.
//!
//! - [`Idempotent`] is an extractor: it validates the key and the client
//!   scope (`X-Client-Id`), reads the body, and fingerprints the request from
//!   its method, its path and its body — no literal paths in handlers.
//! - [`crate::execute()`] with [`Idempotent::keyed`] runs the handler's work
//!   at most once per `(scope, key)`, in one transaction with the key row.
//! - [`respond`] turns the [`Outcome`] into the response: the stored one
//!   (replayed with `Idempotent-Replayed: true`), or a [`Refused`] for a
//!   request in flight (409) or a reused key (422), which the service
//!   renders through its own error type.
//!
//! The fingerprint uses the request's path, not the route template: the
//! same key sent to cancel two different orders is two different requests.

use std::marker::PhantomData;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use crate::{IdempotencyKey, Keyed, Outcome};

/// Header naming the client; keys are scoped to it.
pub const CLIENT_HEADER: &str = "x-client-id";
/// Scope of requests that name no client.
pub const ANONYMOUS: &str = "anonymous";

/// What this layer refuses, with its HTTP meaning. A service's error type
/// wraps it (`From<Refused>`) and renders it its own way, e.g. as
/// problem+json with [`Refused::status`], [`Refused::problem_type`] and
/// [`Refused::title`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Missing or invalid key or client header, unreadable body (400).
    #[error("{0}")]
    BadRequest(String),
    /// The first request with this key has not finished (409, retry later).
    #[error("a request with this Idempotency-Key is still in flight; retry later")]
    InFlight,
    /// The key was used for a different request (422).
    #[error("this Idempotency-Key was already used with a different request")]
    KeyReused,
}

impl Refused {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::InFlight => StatusCode::CONFLICT,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// An RFC 9457 problem type for it.
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "/problems/bad-request",
            Self::InFlight => "/problems/idempotency-key-in-flight",
            Self::KeyReused => "/problems/idempotency-key-reused",
        }
    }

    /// A short title.
    pub fn title(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "Bad request",
            Self::InFlight => "Request in flight",
            Self::KeyReused => "Idempotency-Key reused",
        }
    }

    /// Seconds a client should wait before retrying (`Retry-After`), if any.
    pub fn retry_after(&self) -> Option<u32> {
        matches!(self, Self::InFlight).then_some(1)
    }
}

/// How long completed keys are remembered, as a typed setting.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    /// How long a completed Idempotency-Key is remembered, in seconds.
    #[arg(
        long = "idempotency-ttl-secs",
        env = "IDEMPOTENCY_TTL_SECS",
        default_value_t = 86_400
    )]
    pub ttl_secs: u64,
}

impl KeyArgs {
    /// The key lifetime.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }
}

/// The client scope of a request: `X-Client-Id` (1..=64 printable ASCII),
/// or [`ANONYMOUS`] when absent.
pub fn client_scope(headers: &HeaderMap) -> Result<String, String> {
    match headers.get(CLIENT_HEADER) {
        None => Ok(ANONYMOUS.to_owned()),
        Some(v) => v
            .to_str()
            .ok()
            .filter(|s| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .map(str::to_owned)
            .ok_or_else(|| "X-Client-Id must be 1..=64 printable ASCII characters".to_owned()),
    }
}

/// The authenticated client of a request, put in its extensions by the
/// service's authentication: when present it is the key's scope and
/// `X-Client-Id` is ignored (a caller cannot borrow another client's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(pub String);

/// A request under `Idempotency-Key`: who asked, with which key, what it
/// looks like (fingerprint) and its body.
#[derive(Debug, Clone)]
pub struct Idempotent<E> {
    /// The validated key.
    pub key: String,
    /// The client the key belongs to.
    pub scope: String,
    /// [`crate::fingerprint`] of method, path and body.
    pub fingerprint: String,
    /// The request body.
    pub body: Bytes,
    refusal: PhantomData<fn() -> E>,
}

impl<S, E> FromRequest<S> for Idempotent<E>
where
    S: Send + Sync,
    E: From<Refused> + axum::response::IntoResponse,
{
    type Rejection = E;

    async fn from_request(req: Request, state: &S) -> Result<Self, E> {
        let bad = |detail: String| E::from(Refused::BadRequest(detail));
        let key = IdempotencyKey::from_headers(req.headers()).map_err(|e| bad(e.to_string()))?;
        let scope = match req.extensions().get::<Scope>() {
            Some(Scope(authenticated)) => authenticated.clone(),
            None => client_scope(req.headers()).map_err(bad)?,
        };
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|e| bad(format!("unreadable body: {}", e.body_text())))?;
        // NEGATIVE CONTROL ONLY: every request gets a key of its own.
        let key = if crate::unsafe_disabled() {
            uuid::Uuid::new_v4().to_string()
        } else {
            key.0
        };
        Ok(Self {
            fingerprint: crate::fingerprint(method.as_str(), &path, &body),
            key,
            scope,
            body,
            refusal: PhantomData,
        })
    }
}

impl<E> Idempotent<E> {
    /// The identity of this request for [`crate::execute()`].
    pub fn keyed(&self) -> Keyed<'_> {
        Keyed {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
        }
    }
}

/// The response for `outcome`: the stored one (replayed with
/// `Idempotent-Replayed: true`), or the refusal.
pub fn respond(outcome: Outcome) -> Result<Response, Refused> {
    match outcome {
        Outcome::Completed(stored) => Ok(stored.to_response(false)),
        Outcome::Replayed(stored) => {
            telemetry::metrics::incr("http_idempotent_replays_total", &[]);
            Ok(stored.to_response(true))
        }
        Outcome::InFlight => {
            telemetry::metrics::incr("http_idempotent_in_flight_total", &[]);
            Err(Refused::InFlight)
        }
        Outcome::Mismatch => Err(Refused::KeyReused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoredResponse;
    use axum::http::Request as HttpRequest;

    /// A service's error type, as small as it gets.
    #[derive(Debug, PartialEq)]
    struct Refusal(Refused);

    impl From<Refused> for Refusal {
        fn from(r: Refused) -> Self {
            Self(r)
        }
    }

    impl axum::response::IntoResponse for Refusal {
        fn into_response(self) -> Response {
            self.0.status().into_response()
        }
    }

    async fn extract(
        path: &str,
        key: Option<&str>,
        client: Option<&str>,
        body: &str,
    ) -> Result<Idempotent<Refusal>, Refusal> {
        let mut req = HttpRequest::post(path);
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        if let Some(c) = client {
            req = req.header(CLIENT_HEADER, c);
        }
        let req = req.body(axum::body::Body::from(body.to_owned())).unwrap();
        Idempotent::from_request(req, &()).await
    }

    #[tokio::test]
    async fn extracts_key_scope_and_a_fingerprint_of_method_path_and_body() {
        let a = extract("/orders/1/cancel", Some("k"), Some("shop"), "{}")
            .await
            .unwrap();
        assert_eq!((a.key.as_str(), a.scope.as_str()), ("k", "shop"));
        assert_eq!(a.fingerprint, crate::fingerprint("POST", "/orders/1/cancel", b"{}"));
        let other_order = extract("/orders/2/cancel", Some("k"), Some("shop"), "{}")
            .await
            .unwrap();
        assert_ne!(
            a.fingerprint, other_order.fingerprint,
            "the path, not the route template"
        );
        let anonymous = extract("/orders", Some("k"), None, "{}").await.unwrap();
        assert_eq!(anonymous.scope, ANONYMOUS);
    }

    #[tokio::test]
    async fn refuses_a_missing_key_and_a_bad_client() {
        let missing = extract("/orders", None, None, "{}").await.unwrap_err();
        assert!(
            matches!(&missing.0, Refused::BadRequest(d) if d.contains("required")),
            "{missing:?}"
        );
        let client = extract("/orders", Some("k"), Some("a b"), "{}").await.unwrap_err();
        assert!(
            matches!(&client.0, Refused::BadRequest(d) if d.contains("X-Client-Id")),
            "{client:?}"
        );
    }

    #[test]
    fn outcomes_map_to_responses_and_refusals() {
        let stored = StoredResponse::json(StatusCode::CREATED, &1, "application/json");
        let replay = respond(Outcome::Replayed(stored.clone())).unwrap();
        assert_eq!(replay.headers()[crate::REPLAYED_HEADER], "true");
        let fresh = respond(Outcome::Completed(stored)).unwrap();
        assert!(fresh.headers().get(crate::REPLAYED_HEADER).is_none());
        let in_flight = respond(Outcome::InFlight).unwrap_err();
        assert_eq!(
            (in_flight.status(), in_flight.retry_after()),
            (StatusCode::CONFLICT, Some(1))
        );
        assert_eq!(
            respond(Outcome::Mismatch).unwrap_err().status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
    }
}
