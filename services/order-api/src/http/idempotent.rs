//! Runs a handler body under an `Idempotency-Key` (see the `idempotency`
//! crate), mapping the outcome to HTTP.

use axum::http::HeaderMap;
use axum::response::Response;
use idempotency::{IdempotencyKey, Keyed, Outcome};

use crate::http::ApiError;
use crate::AppState;

/// Header naming the client; Idempotency-Keys are scoped to it.
pub const CLIENT_HEADER: &str = "x-client-id";
/// Scope used when no client header is sent.
pub const ANONYMOUS: &str = "anonymous";

/// The client scope of a request (`X-Client-Id`, 1..=64 printable ASCII).
pub fn client_scope(headers: &HeaderMap) -> Result<String, ApiError> {
    match headers.get(CLIENT_HEADER) {
        None => Ok(ANONYMOUS.to_owned()),
        Some(v) => v
            .to_str()
            .ok()
            .filter(|s| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .map(str::to_owned)
            .ok_or_else(|| ApiError::BadRequest("X-Client-Id must be 1..=64 printable ASCII characters".into())),
    }
}

/// The work done on first execution, inside the idempotency transaction.
pub type Work = idempotency::Work<ApiError>;

/// Executes `work` at most once per (client, key, request).
///
/// - replays a completed response byte for byte (with `Idempotent-Replayed: true`);
/// - 409 while the first request is in flight, 422 for a different request;
/// - stores domain outcomes (2xx, 404, 409, 422) with the key; infrastructure
///   errors roll everything back, so a retry runs again.
pub async fn execute(
    state: &AppState,
    headers: &HeaderMap,
    method: &str,
    path: &str,
    body: &[u8],
    work: Work,
) -> Result<Response, ApiError> {
    let key = IdempotencyKey::from_headers(headers)?;
    let scope = client_scope(headers)?;
    let fingerprint = idempotency::fingerprint(method, path, body);
    let request = Keyed {
        scope: &scope,
        key: &key.0,
        fingerprint: &fingerprint,
    };
    let outcome = idempotency::execute(&state.pool, request, state.idempotency_ttl, work, |e: &ApiError| {
        e.is_final().then(|| e.to_stored())
    })
    .await?;
    match outcome {
        Outcome::Completed(stored) => {
            fail::fail_point!("order_api::after_commit_before_response", |_| std::process::abort());
            Ok(stored.to_response(false))
        }
        Outcome::Replayed(stored) => {
            telemetry::metrics::incr("http_idempotent_replays_total", &[("method", method)]);
            Ok(stored.to_response(true))
        }
        Outcome::InFlight => {
            telemetry::metrics::incr("http_idempotent_in_flight_total", &[]);
            Err(ApiError::KeyInFlight)
        }
        Outcome::Mismatch => Err(ApiError::KeyReused),
    }
}
