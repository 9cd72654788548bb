//! Service-to-service and operator authentication with configured secrets:
//! `Authorization: Bearer <secret>`, where each secret names one caller.
//!
//! The gateway knows its callers from `GATEWAY_CLIENTS`
//! (`order-api=<secret>,payment-service=<secret>`), a service its
//! operator from `OPERATOR_KEY` ([`crate::admin::AccessArgs`]). A request whose secret matches
//! runs as that caller — its [`credentials::Scope`]; any other is a 401
//! problem+json, before any handler (and any database) is reached.
//! Comparison is in constant time; the secrets never print.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use credentials::{constant_time_eq, Scope, Secret};

use crate::problem::Problem;

/// The callers a service accepts: (name, secret) pairs.
#[derive(Clone, PartialEq, Eq)]
pub struct Callers(Arc<Vec<(String, Secret)>>);

impl Callers {
    /// One caller.
    pub fn one(name: &str, secret: Secret) -> Self {
        Self(Arc::new(vec![(name.to_owned(), secret)]))
    }

    /// One caller whose secret is being rotated: the new one and, while
    /// given, the old one name it.
    pub fn rotating(name: &str, secret: Secret, previous: Option<Secret>) -> Self {
        let secrets = std::iter::once(secret).chain(previous);
        Self(Arc::new(secrets.map(|s| (name.to_owned(), s)).collect()))
    }

    /// The caller presenting `presented`, if any. Every entry is compared,
    /// so the time taken does not say which one matched.
    pub fn caller(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        for (name, secret) in self.0.iter() {
            if constant_time_eq(secret.expose(), presented) {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// The callers' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    /// These callers and `others`'s, each under its own name.
    pub fn and(&self, others: &Callers) -> Self {
        Self(Arc::new(self.0.iter().chain(others.0.iter()).cloned().collect()))
    }
}

impl std::str::FromStr for Callers {
    type Err = String;

    /// `name=secret[,name=secret…]`; names 1..=64 of `[A-Za-z0-9._-]`, each
    /// secret a [`Secret`], no secret twice, at most two secrets per name —
    /// the old and the new while a caller's secret is rotated (give the
    /// gateway both, move the caller to the new one, then drop the old).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut callers: Vec<(String, Secret)> = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, secret) = entry
                .split_once('=')
                .ok_or_else(|| "each caller is name=secret".to_owned())?;
            let valid = !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !valid {
                return Err(format!("caller name {name:?}: 1..=64 of A-Z a-z 0-9 . _ -"));
            }
            let secret = Secret::new(secret).map_err(|e| format!("caller {name}: {e}"))?;
            if callers.iter().any(|(_, s)| *s == secret) {
                return Err(format!("caller {name}: a secret given twice"));
            }
            if callers.iter().filter(|(n, _)| n == name).count() >= 2 {
                return Err(format!(
                    "caller {name}: more than two secrets (the old and the new, while rotating)"
                ));
            }
            callers.push((name.to_owned(), secret));
        }
        if callers.is_empty() {
            return Err("at least one caller (name=secret)".into());
        }
        Ok(Self(Arc::new(callers)))
    }
}

impl clap::builder::ValueParserFactory for Callers {
    type Parser = credentials::SecretParser<Callers>;

    fn value_parser() -> Self::Parser {
        Default::default()
    }
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// The bearer secret of a request, if it carries one.
pub fn presented(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// The secret of a request by bearer or, for a person at a browser, by
/// HTTP Basic (the secret as the password; the user name is not read).
pub fn presented_or_basic(headers: &axum::http::HeaderMap) -> Option<String> {
    use base64::Engine as _;
    if let Some(bearer) = presented(headers) {
        return Some(bearer.to_owned());
    }
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?
        .trim();
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    let (_, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(password.to_owned()).filter(|p| !p.is_empty())
}

/// The 401 every refused request gets (with `WWW-Authenticate: Bearer`).
pub fn unauthenticated(detail: &str) -> Response {
    let mut resp = Problem::new(
        StatusCode::UNAUTHORIZED,
        "/problems/unauthenticated",
        "Unauthenticated",
        detail,
    )
    .into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// The middleware: a known caller's request runs with its [`Scope`]; any
/// other is refused.
pub async fn require(State(callers): State<Callers>, req: Request, next: Next) -> Response {
    let secret = presented(req.headers()).map(str::to_owned);
    admit(&callers, secret.as_deref(), req, next)
        .await
        .unwrap_or_else(|r| r)
}

/// [`require`] for an admin port's records: a bearer credential or, from a
/// browser, HTTP Basic with the credential as password — a refusal also
/// offers Basic, so a browser asks its user for it.
pub async fn require_admin(State(callers): State<Callers>, req: Request, next: Next) -> Response {
    let secret = presented_or_basic(req.headers());
    admit(&callers, secret.as_deref(), req, next)
        .await
        .unwrap_or_else(|mut r| {
            r.headers_mut().append(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"effectively-once admin\", charset=\"UTF-8\""),
            );
            r
        })
}

async fn admit(callers: &Callers, secret: Option<&str>, mut req: Request, next: Next) -> Result<Response, Response> {
    let Some(secret) = secret else {
        telemetry::metrics::incr("api_refusals_total", &[("reason", "unauthenticated")]);
        return Err(unauthenticated(
            "a credential is required: Authorization: Bearer <secret>",
        ));
    };
    let Some(caller) = callers.caller(secret).map(str::to_owned) else {
        telemetry::metrics::incr("api_refusals_total", &[("reason", "unauthenticated")]);
        return Err(unauthenticated("unknown credential"));
    };
    req.extensions_mut().insert(Scope(caller));
    Ok(next.run(req).await)
}

/// The OpenAPI security scheme of a bearer-authenticated API: a service
/// declares a const one and adds it with `modifiers(&SCHEME)` and
/// `security(("<name>" = []))`.
pub struct BearerScheme {
    /// The scheme's name in `components.securitySchemes`.
    pub name: &'static str,
    /// What the credential is and where it comes from.
    pub description: &'static str,
}

/// The scheme of a caller's configured secret, named `bearer`.
pub const CALLER_SCHEME: BearerScheme = BearerScheme {
    name: "bearer",
    description: "Authorization: Bearer <credential>",
};

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            self.name,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(self.description))
                    .build(),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(c: char) -> String {
        c.to_string().repeat(32)
    }

    #[test]
    fn callers_parse_and_match_by_secret() {
        let callers: Callers = format!("order-api={},payment-service={}", secret('a'), secret('b'))
            .parse()
            .unwrap();
        assert_eq!(callers.caller(&secret('a')), Some("order-api"));
        assert_eq!(callers.caller(&secret('b')), Some("payment-service"));
        assert_eq!(callers.caller(&secret('c')), None);
        assert_eq!(callers.caller(""), None);
        assert!(!format!("{callers:?}").contains(&secret('a')), "secrets never print");
    }

    /// Rotation: a caller's old and new secrets both name it, so requests
    /// keep their scope (their Idempotency-Keys, their operations) across
    /// the change.
    #[test]
    fn a_caller_may_have_two_secrets_while_one_is_rotated() {
        let callers: Callers = format!("order-api={},order-api={}", secret('a'), secret('n'))
            .parse()
            .unwrap();
        assert_eq!(callers.caller(&secret('a')), Some("order-api"), "the old one");
        assert_eq!(callers.caller(&secret('n')), Some("order-api"), "the new one");
        assert_eq!(callers.caller(&secret('c')), None);
        let operator = |previous| Callers::rotating("operator", secret('n').parse().unwrap(), previous);
        let both = operator(Some(secret('a').parse().unwrap()));
        assert_eq!(both.caller(&secret('a')), Some("operator"), "the old one, while given");
        assert_eq!(both.caller(&secret('n')), Some("operator"));
        assert_eq!(operator(None).caller(&secret('a')), None, "the old one, once dropped");
    }

    #[test]
    fn a_browser_may_send_the_secret_as_basic_auths_password() {
        use axum::http::HeaderMap;
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, value.parse().unwrap());
            presented_or_basic(&h)
        };
        // base64("operator:" + 32 × 'a') and base64("x:") — an empty password.
        let basic = format!("Basic {}", "b3BlcmF0b3I6YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=");
        assert_eq!(with(&basic), Some(secret('a')));
        assert_eq!(with(&format!("Bearer {}", secret('b'))), Some(secret('b')));
        assert_eq!(with("Basic eDo="), None, "an empty password");
        assert_eq!(with("Basic !!!"), None, "not base64");
        assert_eq!(presented_or_basic(&HeaderMap::new()), None);
        let both = Callers::one("operator", secret('a').parse().unwrap())
            .and(&format!("order-api={}", secret('b')).parse().unwrap());
        assert_eq!(both.caller(&secret('b')), Some("order-api"));
        assert_eq!(both.caller(&secret('a')), Some("operator"));
    }

    #[test]
    fn bad_lists_are_refused() {
        for bad in [
            String::new(),
            "order-api".into(),
            "order-api=short".into(),
            format!("bad name={}", secret('a')),
            format!("a={},a={},a={}", secret('a'), secret('b'), secret('c')),
            format!("a={},b={}", secret('a'), secret('a')),
        ] {
            assert!(bad.parse::<Callers>().is_err(), "{bad:?} accepted");
        }
    }
}
