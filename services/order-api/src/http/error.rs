//! The one place where errors become HTTP responses: RFC 9457
//! `application/problem+json`. A 500 never carries internals.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub use service_kit::problem::{Problem, PROBLEM_JSON};

/// Errors of the HTTP API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed request (bad JSON syntax, bad header, bad path).
    #[error("{0}")]
    BadRequest(String),
    /// Well-formed but invalid content.
    #[error("{0}")]
    Unprocessable(String),
    /// Refused by the Idempotency-Key layer (bad key, in flight, reused).
    #[error(transparent)]
    Refused(#[from] idempotency::Refused),
    /// Not in a state that allows the action.
    #[error("{0}")]
    Conflict(String),
    /// No such resource.
    #[error("not found")]
    NotFound,
    /// A dependency (the card vault) is down: nothing stored, retry later.
    #[error("{0}")]
    Unavailable(String),
    /// Turned away under load (admission control): nothing stored, retry later.
    #[error("{}", .0.detail())]
    Overloaded(crate::http::admission::Overload),
    /// Anything else: logged, not shown.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

service_kit::internal_errors!(ApiError: sqlx::Error, idempotency::Error, crate::saga::Error, outbox::Error);

impl ApiError {
    /// The problem document for this error.
    pub fn problem(&self) -> Problem {
        let (status, kind, title) = match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "/problems/bad-request", "Bad request"),
            Self::Unprocessable(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/invalid-order",
                "Invalid request",
            ),
            Self::Refused(r) => (r.status(), r.problem_type(), r.title()),
            Self::Conflict(_) => (StatusCode::CONFLICT, "/problems/conflict", "Conflict"),
            Self::NotFound => (StatusCode::NOT_FOUND, "/problems/not-found", "Not found"),
            Self::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "/problems/unavailable",
                "Temporarily unavailable",
            ),
            Self::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "/problems/overloaded", "Overloaded"),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "/problems/internal",
                "Internal error",
            ),
        };
        Problem::new(status, kind, title, self.to_string())
    }

    /// Whether a retry with the same key must see this same outcome (so it is
    /// stored under the key): domain outcomes yes, infrastructure failures no.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Unprocessable(_) | Self::Conflict(_) | Self::NotFound)
    }

    /// As a stored (replayable) response.
    pub fn to_stored(&self) -> idempotency::StoredResponse {
        let p = self.problem();
        idempotency::StoredResponse::json(p.status_code(), &p, PROBLEM_JSON)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Internal(e) => tracing::error!(error = ?e, "request failed"),
            Self::Overloaded(why) => telemetry::metrics::incr("api_refusals_total", &[("reason", why.reason())]),
            _ => {}
        }
        let mut resp = self.to_stored().to_response(false);
        if let Some(secs) = retry_after(&self) {
            resp.headers_mut().insert(header::RETRY_AFTER, secs);
        }
        resp
    }
}

/// `Retry-After` for a refusal that asks the client to come back.
fn retry_after(e: &ApiError) -> Option<HeaderValue> {
    match e {
        ApiError::Refused(r) => r.retry_after().map(HeaderValue::from),
        ApiError::Unavailable(_) | ApiError::Overloaded(_) => Some(HeaderValue::from(1)),
        _ => None,
    }
}
