//! The axum adapter: one way for every HTTP API here (order-api and the
//! mock gateway) to put a handler under `Idempotency-Key`.
//!
//! - [`Idempotent`] is an extractor: it validates the key, takes the scope
//!   from the service's authentication ([`Scope`]; a request without one is
//!   refused — a caller never names its own scope), reads the body, and
//!   fingerprints the request from its method, its path and its body, keyed
//!   with the service's [`FingerprintKey`] — no literal paths in handlers.
//! - [`crate::begin`] and [`crate::complete`] with [`Idempotent::keyed`]
//!   open and commit the handler's transaction: its work runs at most once
//!   per `(scope, key)`, committed with the key row and the response.
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
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::StatusCode;
use axum::response::Response;

use crate::{IdempotencyKey, Keyed, Outcome, Secret};

/// What this layer refuses, with its HTTP meaning. A service's error type
/// wraps it (`From<Refused>`) and renders it its own way, e.g. as
/// problem+json with [`Refused::status`], [`Refused::problem_type`] and
/// [`Refused::title`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Missing or invalid key, unreadable body (400).
    #[error("{0}")]
    BadRequest(String),
    /// No authenticated client: the service's authentication did not run
    /// before the extractor (401).
    #[error("no authenticated client")]
    Unauthenticated,
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
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::InFlight => StatusCode::CONFLICT,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// An RFC 9457 problem type for it.
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "/problems/bad-request",
            Self::Unauthenticated => "/problems/unauthenticated",
            Self::InFlight => "/problems/idempotency-key-in-flight",
            Self::KeyReused => "/problems/idempotency-key-reused",
        }
    }

    /// A short title.
    pub fn title(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "Bad request",
            Self::Unauthenticated => "Unauthenticated",
            Self::InFlight => "Request in flight",
            Self::KeyReused => "Idempotency-Key reused",
        }
    }

    /// Seconds a client should wait before retrying (`Retry-After`), if any.
    pub fn retry_after(&self) -> Option<u32> {
        matches!(self, Self::InFlight).then_some(1)
    }
}

/// How long a completed key is remembered unless `IDEMPOTENCY_TTL_SECS`
/// says otherwise: a day, in seconds.
pub const DEFAULT_TTL_SECS: u64 = 86_400;

/// How long completed keys are remembered, and the secret their request
/// fingerprints are keyed with, as typed settings.
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    /// How long a completed Idempotency-Key is remembered, in seconds.
    #[arg(
        long = "idempotency-ttl-secs",
        env = "IDEMPOTENCY_TTL_SECS",
        default_value_t = DEFAULT_TTL_SECS
    )]
    pub ttl_secs: u64,
    /// Secret the request fingerprints are keyed with (HMAC-SHA256): a body
    /// may hold a card number, and an unkeyed hash of it can be reversed.
    /// No default. To rotate it, set the old one as
    /// `IDEMPOTENCY_FINGERPRINT_KEY_PREVIOUS` for as long as keys live: a
    /// retry of a request stored under the old key still matches.
    #[arg(
        long = "idempotency-fingerprint-key",
        env = "IDEMPOTENCY_FINGERPRINT_KEY",
        value_name = "IDEMPOTENCY_FINGERPRINT_KEY",
        hide_env_values = true
    )]
    pub fingerprint_key: Secret,
    /// The fingerprint key before the last rotation, still accepted for
    /// matching (never for storing) until every key stored under it has
    /// expired.
    #[arg(
        long = "idempotency-fingerprint-key-previous",
        env = "IDEMPOTENCY_FINGERPRINT_KEY_PREVIOUS",
        value_name = "IDEMPOTENCY_FINGERPRINT_KEY_PREVIOUS",
        hide_env_values = true
    )]
    pub previous_fingerprint_key: Option<Secret>,
}

impl KeyArgs {
    /// The key lifetime.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }

    /// The fingerprint key (and the one before it, while rotating).
    pub fn fingerprint_key(&self) -> FingerprintKey {
        let key = FingerprintKey::new(self.fingerprint_key.clone());
        match &self.previous_fingerprint_key {
            Some(previous) => key.rotated_from(previous.clone()),
            None => key,
        }
    }
}

/// The secret request fingerprints are keyed with. A service's state gives
/// it to [`Idempotent`] through `FromRef`.
#[derive(Debug, Clone)]
pub struct FingerprintKey {
    key: Secret,
    previous: Option<Secret>,
}

impl FingerprintKey {
    /// Fingerprints keyed with `key`.
    pub fn new(key: Secret) -> Self {
        Self { key, previous: None }
    }

    /// While rotating: a request also matches a stored fingerprint taken
    /// under `previous` (new ones are stored under the current key).
    pub fn rotated_from(self, previous: Secret) -> Self {
        Self {
            previous: Some(previous),
            ..self
        }
    }

    /// The current key.
    pub(crate) fn current(&self) -> &Secret {
        &self.key
    }

    /// The key before the last rotation, if still accepted.
    pub(crate) fn previous(&self) -> Option<FingerprintKey> {
        self.previous.clone().map(Self::new)
    }

    /// A fixed key for unit tests.
    pub fn for_tests() -> Self {
        Self::new(Secret::new("fingerprint-key-for-unit-tests-only").expect("long enough"))
    }
}

/// The `Idempotency-Key` header in the OpenAPI documents: a handler taking
/// [`Idempotent`] names it in `#[utoipa::path(params(KeyHeader))]`; the
/// pattern is what [`Idempotent`] accepts.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct KeyHeader {
    /// 1–255 printable ASCII characters, no quote; a retry with the same key and body gets the first response.
    #[param(rename = "Idempotency-Key", pattern = "^[!#-~]{1,255}$")]
    pub key: String,
}

pub use credentials::Scope;

/// A request under `Idempotency-Key`: who asked, with which key, what it
/// looks like (fingerprint) and its body.
#[derive(Debug, Clone)]
pub struct Idempotent<E> {
    /// The validated key.
    pub key: String,
    /// The client the key belongs to.
    pub scope: String,
    /// [`crate::fingerprint`] of method, path and body, keyed.
    pub fingerprint: String,
    /// The same under the previous key, while the key is rotated.
    pub previous_fingerprint: Option<String>,
    /// The request body.
    pub body: Bytes,
    refusal: PhantomData<fn() -> E>,
}

impl<S, E> FromRequest<S> for Idempotent<E>
where
    S: Send + Sync,
    FingerprintKey: FromRef<S>,
    E: From<Refused> + axum::response::IntoResponse,
{
    type Rejection = E;

    async fn from_request(req: Request, state: &S) -> Result<Self, E> {
        let bad = |detail: String| E::from(Refused::BadRequest(detail));
        let key = IdempotencyKey::from_headers(req.headers()).map_err(|e| bad(e.to_string()))?;
        let Some(Scope(scope)) = req.extensions().get::<Scope>().cloned() else {
            return Err(E::from(Refused::Unauthenticated));
        };
        let fingerprint_key = FingerprintKey::from_ref(state);
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|e| bad(format!("unreadable body: {}", e.body_text())))?;
        let key = key.0;
        #[cfg(feature = "negative-controls")]
        let key = crate::negative_controls::key(key);
        let previous_fingerprint = fingerprint_key
            .previous()
            .map(|previous| crate::fingerprint(&previous, method.as_str(), &path, &body));
        Ok(Self {
            fingerprint: crate::fingerprint(&fingerprint_key, method.as_str(), &path, &body),
            previous_fingerprint,
            key,
            scope,
            body,
            refusal: PhantomData,
        })
    }
}

impl<E> Idempotent<E> {
    /// The identity of this request for [`crate::begin`] and [`crate::complete`].
    pub fn keyed(&self) -> Keyed<'_> {
        Keyed {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            previous_fingerprint: self.previous_fingerprint.as_deref(),
        }
    }
}

/// The response for `outcome`: the stored one (replayed with
/// `Idempotent-Replayed: true`), or the refusal.
pub fn respond(outcome: Outcome) -> Result<Response, Refused> {
    match outcome {
        Outcome::Completed(stored) => Ok(stored.to_response(false)),
        Outcome::Replayed(stored) => {
            metrics::counter!("http_idempotent_replays_total").increment(1);
            Ok(stored.to_response(true))
        }
        Outcome::InFlight => {
            metrics::counter!("http_idempotent_in_flight_total").increment(1);
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
        let mut req = req.body(axum::body::Body::from(body.to_owned())).unwrap();
        if let Some(c) = client {
            req.extensions_mut().insert(Scope(c.to_owned()));
        }
        Idempotent::from_request(req, &FingerprintKey::for_tests()).await
    }

    #[tokio::test]
    async fn extracts_key_scope_and_a_fingerprint_of_method_path_and_body() {
        let a = extract("/orders/1/cancel", Some("k"), Some("shop"), "{}")
            .await
            .unwrap();
        assert_eq!((a.key.as_str(), a.scope.as_str()), ("k", "shop"));
        assert_eq!(
            a.fingerprint,
            crate::fingerprint(&FingerprintKey::for_tests(), "POST", "/orders/1/cancel", b"{}")
        );
        let other_order = extract("/orders/2/cancel", Some("k"), Some("shop"), "{}")
            .await
            .unwrap();
        assert_ne!(
            a.fingerprint, other_order.fingerprint,
            "the path, not the route template"
        );
        let unauthenticated = extract("/orders", Some("k"), None, "{}").await.unwrap_err();
        assert_eq!(unauthenticated.0, Refused::Unauthenticated, "no scope, no request");
    }

    /// While the key is rotated, the extractor fingerprints a request under
    /// both: the current key's is stored, the previous one's matched.
    #[tokio::test]
    async fn a_rotated_key_fingerprints_under_the_current_and_the_previous_key() {
        let old = FingerprintKey::for_tests();
        let new = crate::Secret::new(&"n".repeat(40)).unwrap();
        let rotating = FingerprintKey::new(new.clone()).rotated_from(old.current().clone());
        let request = || {
            HttpRequest::post("/orders")
                .header("idempotency-key", "k")
                .extension(Scope("shop".into()))
                .body(axum::body::Body::from("{}"))
                .unwrap()
        };
        let r: Idempotent<Refusal> = Idempotent::from_request(request(), &rotating).await.unwrap();
        assert_eq!(
            r.fingerprint,
            crate::fingerprint(&FingerprintKey::new(new), "POST", "/orders", b"{}")
        );
        assert_eq!(
            r.previous_fingerprint.as_deref(),
            Some(crate::fingerprint(&old, "POST", "/orders", b"{}").as_str())
        );
        let plain: Idempotent<Refusal> = Idempotent::from_request(request(), &old).await.unwrap();
        assert_eq!(plain.previous_fingerprint, None);
    }

    #[tokio::test]
    async fn refuses_a_missing_key() {
        let missing = extract("/orders", None, Some("shop"), "{}").await.unwrap_err();
        assert!(
            matches!(&missing.0, Refused::BadRequest(d) if d.contains("required")),
            "{missing:?}"
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
        let reused = respond(Outcome::Mismatch).unwrap_err();
        assert_eq!(
            (reused.status(), reused.retry_after()),
            (StatusCode::UNPROCESSABLE_ENTITY, None)
        );
    }

    #[test]
    fn each_refusal_has_its_own_problem_type_and_title() {
        let all = [
            Refused::BadRequest("no key".into()),
            Refused::Unauthenticated,
            Refused::InFlight,
            Refused::KeyReused,
        ];
        let types: std::collections::BTreeSet<_> = all.iter().map(Refused::problem_type).collect();
        let titles: std::collections::BTreeSet<_> = all.iter().map(Refused::title).collect();
        assert_eq!((types.len(), titles.len()), (all.len(), all.len()));
        assert!(types.iter().all(|t| t.starts_with("/problems/")), "{types:?}");
        assert!(titles.iter().all(|t| !t.is_empty()));
        assert_eq!(Refused::InFlight.problem_type(), "/problems/idempotency-key-in-flight");
        assert_eq!(Refused::KeyReused.problem_type(), "/problems/idempotency-key-reused");
    }

    #[test]
    fn the_key_lifetime_is_its_seconds() {
        let args = KeyArgs {
            ttl_secs: 86_400,
            fingerprint_key: crate::Secret::new(&"k".repeat(32)).unwrap(),
            previous_fingerprint_key: None,
        };
        assert_eq!(args.ttl(), Duration::from_secs(86_400));
    }
}
