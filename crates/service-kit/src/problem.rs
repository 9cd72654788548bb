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

/// Why a JSON request body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON at all (400).
    Syntax(String),
    /// JSON of the wrong shape: a missing, mistyped or invalid field (422).
    Data(String),
}

impl JsonError {
    /// The detail, for a problem's `detail`.
    pub fn detail(&self) -> &str {
        match self {
            Self::Syntax(d) | Self::Data(d) => d,
        }
    }
}

impl From<JsonError> for Problem {
    fn from(e: JsonError) -> Self {
        match e {
            JsonError::Syntax(d) => Problem::new(StatusCode::BAD_REQUEST, "/problems/bad-request", "Malformed JSON", d),
            JsonError::Data(d) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/unprocessable",
                "Invalid request",
                d,
            ),
        }
    }
}

/// Parses a JSON request body. The error names the field and what was
/// expected, never the value sent: a body may carry a card number, and an
/// error detail is logged and shown (`card: invalid type: integer,
/// expected a string`, not the digits).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    match parsed {
        Ok(value) => match de.end() {
            Ok(()) => Ok(value),
            Err(e) => Err(JsonError::Syntax(format!("malformed JSON body: {e}"))),
        },
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = without_values(&inner.to_string());
            Err(match inner.classify() {
                serde_json::error::Category::Data if path != "." => JsonError::Data(format!("{path}: {message}")),
                serde_json::error::Category::Data => JsonError::Data(message),
                _ => JsonError::Syntax(format!("malformed JSON body: {message}")),
            })
        }
    }
}

/// A serde message without the value it quotes: "invalid type: integer
/// `4242…`, expected a string" → "invalid type: integer, expected a string".
fn without_values(message: &str) -> String {
    let quotes_a_value = ["invalid type: ", "invalid value: ", "unknown variant "]
        .iter()
        .any(|p| message.starts_with(p));
    if !quotes_a_value {
        return message.to_owned();
    }
    let Some(open) = message.find(['`', '"']) else {
        return message.to_owned();
    };
    let close = message
        .find(", expected")
        .filter(|&c| c > open)
        .unwrap_or(message.len());
    let head = message[..open].trim_end();
    format!("{head}{}", &message[close..])
}

/// `impl From<Source> for Error` for each source, into the error's
/// `Internal(anyhow::Error)` variant: failures that are the service's own
/// (database, outbox, …) — logged with their cause, answered as a bare 500.
///
/// ```
/// #[derive(Debug)]
/// enum Error {
///     Internal(anyhow::Error),
/// }
/// service_kit::internal_errors!(Error: std::io::Error, std::fmt::Error);
/// let Error::Internal(e) = Error::from(std::fmt::Error);
/// assert!(e.is::<std::fmt::Error>());
/// ```
#[macro_export]
macro_rules! internal_errors {
    ($error:ty: $($source:ty),+ $(,)?) => {
        $(impl From<$source> for $error {
            fn from(e: $source) -> Self {
                Self::Internal(e.into())
            }
        })+
    };
}

/// Declares a `problem+json` response of the OpenAPI documents: a type
/// whose name goes in a handler's `#[utoipa::path(responses(…))]` list in
/// place of the whole `(status = …, description = …, body = Problem,
/// content_type = …)` tuple. The shared ones are below; a service declares
/// its own with this macro.
#[macro_export]
macro_rules! problem_response {
    ($(#[$doc:meta])* $name:ident, $status:literal, $description:literal) => {
        $(#[$doc])*
        #[derive(utoipa::IntoResponses)]
        #[response(status = $status, description = $description, content_type = "application/problem+json")]
        pub struct $name(pub $crate::problem::Problem);
    };
}

/// The `problem+json` responses the HTTP services share, for their OpenAPI
/// documents.
pub mod responses {
    crate::problem_response!(
        /// 500: an internal error.
        Internal,
        500,
        "Internal error"
    );
    crate::problem_response!(
        /// 401 of a service whose callers present a configured credential.
        NoCredential,
        401,
        "No or unknown credential"
    );
    crate::problem_response!(
        /// 401 of an operator endpoint.
        NoOperatorCredential,
        401,
        "No or wrong operator credential"
    );
    crate::problem_response!(
        /// 400: a query string that does not parse.
        BadQuery,
        400,
        "Bad query"
    );
    crate::problem_response!(
        /// 400 of an endpoint with a JSON body and an `Idempotency-Key`.
        MalformedBodyOrKey,
        400,
        "Malformed body or key"
    );
    crate::problem_response!(
        /// 409: a request with this `Idempotency-Key` is still running.
        KeyInFlight,
        409,
        "The same key is still being processed"
    );
    crate::problem_response!(
        /// 413: a body over the size limit.
        TooLarge,
        413,
        "Body over the size limit"
    );
    crate::problem_response!(
        /// 408: a body that broke off or timed out before it arrived whole
        /// (nothing stored; send it again with the same key).
        IncompleteBody,
        408,
        "Body incomplete"
    );
    crate::problem_response!(
        /// 503: the service's database does not answer.
        DatabaseUnavailable,
        503,
        "Database unavailable"
    );
}

#[cfg(test)]
mod json_tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Order {
        sku: String,
        card: String,
    }

    #[test]
    fn a_field_error_names_the_field_never_the_value() {
        for body in [
            r#"{"sku":"A","card":4242424242424242}"#,
            r#"{"sku":"A","card":["4242424242424242"]}"#,
            r#"{"sku":"A","card":{"n":"4242424242424242"}}"#,
            r#"{"sku":4242424242424242,"card":"x"}"#,
        ] {
            let e = parse_json::<Order>(body.as_bytes()).unwrap_err();
            assert!(matches!(e, JsonError::Data(_)), "{e:?}");
            assert!(!e.detail().contains("4242"), "{body} → {}", e.detail());
            assert!(
                e.detail().contains("card") || e.detail().contains("sku"),
                "{}",
                e.detail()
            );
        }
        let e = parse_json::<Order>(br#"{"sku":"A","card":4242424242424242}"#).unwrap_err();
        assert!(
            e.detail().starts_with("card: invalid type: integer, expected a string"),
            "{}",
            e.detail()
        );
        let missing = parse_json::<Order>(br#"{"sku":"A"}"#).unwrap_err();
        assert!(
            missing.detail().contains("missing field `card`"),
            "{}",
            missing.detail()
        );
    }

    #[test]
    fn syntax_errors_are_told_apart_and_trailing_input_refused() {
        assert!(matches!(parse_json::<Order>(b"{"), Err(JsonError::Syntax(_))));
        assert!(matches!(
            parse_json::<Order>(br#"{"sku":"A","card":"x"} 4242"#),
            Err(JsonError::Syntax(_))
        ));
        assert!(parse_json::<Order>(br#"{"sku":"A","card":"x"}"#).is_ok());
    }
}
