//! RFC 9457 problem details, the error body of every HTTP API here.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Problem details content type.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI reference naming the problem type.
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// Short summary of the type.
    #[schema(value_type = String)]
    pub title: &'static str,
    /// HTTP status.
    pub status: u16,
    /// This occurrence, in words.
    pub detail: String,
}

impl Problem {
    /// A problem with `status`, type `kind`, `title` and `detail`.
    pub fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            kind,
            title,
            status: status.as_u16(),
            detail: detail.into(),
        }
    }

    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self).expect("problem serialises");
        let mut resp = (self.status_code(), body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        resp
    }
}
