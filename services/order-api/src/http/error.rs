//! The one place where errors become HTTP responses: RFC 9457
//! `application/problem+json`. A 500 never carries internals.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub use runtime::problem::{Problem, PROBLEM_JSON};

/// Errors of the HTTP API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed request (bad JSON syntax, bad header, bad path).
    #[error("{0}")]
    BadRequest(String),
    /// Well-formed but invalid content.
    #[error("{0}")]
    Unprocessable(String),
    /// The Idempotency-Key was already used for a different request.
    #[error("this Idempotency-Key was already used with a different request")]
    KeyReused,
    /// A request with this Idempotency-Key is still being processed.
    #[error("a request with this Idempotency-Key is still in flight; retry later")]
    KeyInFlight,
    /// Not in a state that allows the action.
    #[error("{0}")]
    Conflict(String),
    /// No such resource.
    #[error("not found")]
    NotFound,
    /// Anything else: logged, not shown.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::Internal(e.into())
    }
}

impl From<idempotency::Error> for ApiError {
    fn from(e: idempotency::Error) -> Self {
        Self::Internal(e.into())
    }
}

impl From<messaging::consumer::HandleError> for ApiError {
    fn from(e: messaging::consumer::HandleError) -> Self {
        Self::Internal(anyhow::anyhow!(e))
    }
}

impl From<idempotency::KeyError> for ApiError {
    fn from(e: idempotency::KeyError) -> Self {
        Self::BadRequest(e.to_string())
    }
}

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
            Self::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/idempotency-key-reused",
                "Idempotency-Key reused",
            ),
            Self::KeyInFlight => (
                StatusCode::CONFLICT,
                "/problems/idempotency-key-in-flight",
                "Request in flight",
            ),
            Self::Conflict(_) => (StatusCode::CONFLICT, "/problems/conflict", "Conflict"),
            Self::NotFound => (StatusCode::NOT_FOUND, "/problems/not-found", "Not found"),
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
        if let Self::Internal(e) = &self {
            tracing::error!(error = ?e, "request failed");
        }
        let mut resp = self.to_stored().to_response(false);
        if matches!(self, Self::KeyInFlight) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
