//! Why a request is refused before its work, as problem+json.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use service_kit::problem::Problem;

/// Why a request is refused before it reaches a handler.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No usable `Authorization: Bearer` header, or an unknown or revoked key.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The body is larger than the limit.
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// The body broke off or timed out before it arrived whole (not its
    /// size): nothing was read, nothing stored, and a retry may succeed.
    #[error("the request body broke off or timed out before it arrived whole; nothing was stored: send it again")]
    Incomplete,
    /// Over the client's request rate.
    #[error("more than {0} requests per second")]
    TooMany(f64),
    /// Over the client's allowance of new cards.
    #[error("more than {0} new cards a minute from this client; nothing was stored")]
    TooManyNewCards(f64),
    /// Too many declined payments in the last hour.
    #[error("{0} payments of this client were declined in the last hour: no new card until fewer were")]
    TooManyDeclines(u32),
    /// Over the remote address's allowance of key lookups.
    #[error("more than {0} lookups of uncached API keys per second from this address")]
    TooManyLookups(f64),
    /// The key could not be checked: its lookup failed, or failed moments ago.
    #[error("the API key could not be checked now; retry after Retry-After")]
    Unavailable,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, kind, title) = match self {
            Self::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "/problems/unauthenticated", "Unauthenticated"),
            Self::TooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "/problems/too-large",
                "Request too large",
            ),
            Self::TooMany(_) | Self::TooManyLookups(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "/problems/rate-limited",
                "Too many requests",
            ),
            Self::TooManyNewCards(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "/problems/too-many-new-cards",
                "Too many new cards",
            ),
            Self::TooManyDeclines(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "/problems/too-many-declines",
                "Too many declined payments",
            ),
            Self::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "/problems/unavailable",
                "Service unavailable",
            ),
            Self::Incomplete => (
                StatusCode::REQUEST_TIMEOUT,
                "/problems/incomplete-body",
                "Request body incomplete",
            ),
        };
        let mut resp = Problem::new(status, kind, title, self.to_string()).into_response();
        match self {
            Self::Unauthenticated(_) => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::TooMany(_) | Self::TooManyLookups(_) | Self::TooManyNewCards(_) | Self::Unavailable => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
            }
            Self::TooManyDeclines(_) => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(60));
            }
            Self::TooLarge(_) | Self::Incomplete => {}
        }
        resp
    }
}
