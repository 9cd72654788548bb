//! `Idempotency-Key` for HTTP APIs: layer 1 of the effectively-once design,
//! after the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field".
//!
//! The handler owns the transaction: [`begin`] opens it and claims the key,
//! the handler performs its effect in it (e.g. insert the order and its
//! outbox row), and [`complete`] stores the response and commits. The key
//! row, the effect and the stored response become durable together or not
//! at all ([`flow`] shows the handler; [`claim`] and [`store`] are the
//! same steps in a transaction the caller opened). In an axum handler, the
//! [`Idempotent`] extractor reads the key and fingerprints the body:
//!
//! ```no_run
//! use axum::http::StatusCode;
//! use axum::response::{IntoResponse, Response};
//! use idempotency::{Begun, Idempotent, Refused, StoredResponse};
//!
//! /// The service's own error: a refusal or a failure, rendered its way.
//! struct Problem(StatusCode);
//! impl From<Refused> for Problem {
//!     fn from(r: Refused) -> Self { Self(r.status()) }
//! }
//! impl From<idempotency::Error> for Problem {
//!     fn from(_: idempotency::Error) -> Self { Self(StatusCode::SERVICE_UNAVAILABLE) }
//! }
//! impl IntoResponse for Problem {
//!     fn into_response(self) -> Response { self.0.into_response() }
//! }
//!
//! async fn create(pool: sqlx::PgPool, request: Idempotent<Problem>) -> Result<Response, Problem> {
//!     let keyed = request.keyed();
//!     let mut tx = match idempotency::begin(&pool, keyed).await? {
//!         Begun::New(tx) => tx, // the key is ours: do the work
//!         Begun::Answered(outcome) => return Ok(idempotency::respond(outcome)?), // replay, 409 or 422
//!     };
//!     sqlx::query("INSERT INTO things DEFAULT VALUES")
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(idempotency::Error::from)?;
//!     let created = StoredResponse::json(StatusCode::CREATED, &"made", "application/json");
//!     let ttl = std::time::Duration::from_secs(86_400);
//!     let outcome = idempotency::complete(&pool, tx, keyed, ttl, &created).await?; // stored, committed
//!     Ok(idempotency::respond(outcome)?)
//! }
//! ```
//!
//! | situation | [`Claim`] | HTTP |
//! |---|---|---|
//! | key unseen (or expired) | `New` | run the request |
//! | same key, same fingerprint, completed | `Replay` | stored status/headers/body + `Idempotent-Replayed: true` |
//! | same key, other fingerprint | `Mismatch` | 422 |
//! | same key, first request still running | `InFlight` | 409 + `Retry-After` |
//!
//! "In flight" is a transaction-scoped advisory lock on `(scope, key)`: it is
//! released by commit, rollback or a dropped connection (a crashed process),
//! so it can never be left dangling.

/// The crate's README, compiled and run as documentation tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod at_once;
pub mod flow;
pub mod http;
pub mod key;

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, PgPool, Row};

pub use credentials::{Scope, Secret};
pub use flow::{answered, begin, complete, finish, Begun, Keyed, Outcome};
pub use http::{respond, FingerprintKey, Idempotent, KeyArgs, KeyHeader, Refused, DEFAULT_TTL_SECS};
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};

/// Header set on replayed responses.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The broken layer the chaos suite swaps in (feature `negative-controls`):
/// the extractor hands its key over to it, compiled only with the feature.
#[cfg(feature = "negative-controls")]
pub mod negative_controls;

/// The idempotency table's migrations (versions 1003xxxxxx).
pub fn migrator() -> Migrator {
    sqlx::migrate!("./migrations")
}

/// A response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Headers worth replaying (content type, location).
    pub headers: Vec<(String, String)>,
    /// Body bytes, replayed byte for byte.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A JSON response.
    pub fn json(status: StatusCode, body: &impl serde::Serialize, content_type: &str) -> Self {
        Self {
            status: status.as_u16(),
            headers: vec![("content-type".into(), content_type.into())],
            body: serde_json::to_vec(body).expect("response serialises"),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    /// The HTTP response; `replayed` adds `Idempotent-Replayed: true`.
    pub fn to_response(&self, replayed: bool) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, self.body.clone()).into_response();
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                resp.headers_mut().insert(n, v);
            }
        }
        if replayed {
            resp.headers_mut().insert(
                HeaderName::from_static(REPLAYED_HEADER),
                HeaderValue::from_static("true"),
            );
        }
        resp
    }
}

/// What a claim of a request's key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// First execution: do the work, then [`store`], then commit.
    New,
    /// Already completed with the same request: return this.
    Replay(StoredResponse),
    /// Already used with a different request.
    Mismatch,
    /// The first request with this key has not finished yet.
    InFlight,
}

/// Fingerprint of a request: HMAC-SHA256, under the deployment's
/// [`FingerprintKey`], of method, path and the body, the body canonicalised
/// (object keys sorted, whitespace dropped) when it is JSON, so a retry that
/// re-serialises the same document still matches.
///
/// Keyed, because a body may hold a card number: an unkeyed hash of a body
/// whose other fields the stored response shows can be reversed by trying
/// the ~10^5 numbers that fit a known BIN and last four (PCI DSS 3.5 allows
/// only keyed hashes of a PAN). Without the key no value here can be
/// tested against a guess.
pub fn fingerprint(key: &FingerprintKey, method: &str, path: &str, body: &[u8]) -> String {
    let canonical = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| serde_json::to_vec(&v).ok())
        .unwrap_or_else(|| body.to_vec());
    let mut mac =
        Hmac::<Sha256>::new_from_slice(key.current().expose().as_bytes()).expect("HMAC takes a key of any length");
    mac.update(method.as_bytes());
    mac.update(&[0]);
    mac.update(path.as_bytes());
    mac.update(&[0]);
    mac.update(&canonical);
    hex::encode(mac.finalize().into_bytes())
}

/// Claims a request's key inside the caller's transaction.
///
/// One statement both tries the in-flight lock and reads the key's row. A
/// completed key is answered from its row whether or not the lock was free,
/// so concurrent replays never see each other as "in flight". If the first
/// request commits between this statement's snapshot and its lock, the row
/// is not seen and the request runs — and [`store`] then finds the key
/// taken, so the caller rolls back and replays (see [`complete`]).
pub async fn claim(conn: &mut PgConnection, scope: &str, key: &str, fingerprint: &str) -> Result<Claim> {
    claim_any(conn, scope, key, &[fingerprint]).await
}

/// [`claim`] for a request that may match a stored key under any of
/// `fingerprints` (the current key's and, while it is rotated, the
/// previous one's).
pub(crate) async fn claim_any(conn: &mut PgConnection, scope: &str, key: &str, fingerprints: &[&str]) -> Result<Claim> {
    // A 64-bit hash collision of the lock key can only cause a spurious 409.
    let row = sqlx::query(
        "SELECT pg_try_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 7)) AS locked,
                k.fingerprint, k.status_code, k.headers, k.body, k.expires_at <= now() AS expired
         FROM (SELECT 1) AS one
         LEFT JOIN idempotency_keys k ON k.scope = $1 AND k.key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_one(&mut *conn)
    .await?;
    let locked: bool = row.get("locked");
    let expired: Option<bool> = row.get("expired");
    match expired {
        Some(false) => Ok(stored_outcome(&row, fingerprints)),
        Some(true) if locked => {
            sqlx::query("DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND expires_at <= now()")
                .bind(scope)
                .bind(key)
                .execute(&mut *conn)
                .await?;
            Ok(Claim::New)
        }
        None if locked => Ok(Claim::New),
        _ => Ok(Claim::InFlight),
    }
}

/// The stored outcome of a completed key, if it is there and unexpired.
pub async fn lookup(conn: &mut PgConnection, scope: &str, key: &str, fingerprint: &str) -> Result<Option<Claim>> {
    lookup_any(conn, scope, key, &[fingerprint]).await
}

/// [`lookup`] under any of `fingerprints`, as [`claim_any`].
pub(crate) async fn lookup_any(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    fingerprints: &[&str],
) -> Result<Option<Claim>> {
    let row = sqlx::query(
        "SELECT fingerprint, status_code, headers, body FROM idempotency_keys
         WHERE scope = $1 AND key = $2 AND expires_at > now()",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| stored_outcome(&r, fingerprints)))
}

fn stored_outcome(row: &sqlx::postgres::PgRow, fingerprints: &[&str]) -> Claim {
    if !fingerprints.contains(&row.get::<&str, _>("fingerprint")) {
        return Claim::Mismatch;
    }
    let headers: sqlx::types::Json<Vec<(String, String)>> = row.get("headers");
    Claim::Replay(StoredResponse {
        status: row.get::<i16, _>("status_code") as u16,
        headers: headers.0,
        body: row.get("body"),
    })
}

/// Stores the response of a [`Claim::New`] request in the caller's
/// transaction; it becomes visible (and replayable) when that commits.
/// Returns false when the key was completed meanwhile by a concurrent
/// request: the caller must roll back its effect and replay that one.
pub async fn store(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    fingerprint: &str,
    ttl: Duration,
    response: &StoredResponse,
) -> Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, headers, body, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
         ON CONFLICT (scope, key) DO NOTHING",
    )
    .bind(scope)
    .bind(key)
    .bind(fingerprint)
    .bind(response.status as i16)
    .bind(sqlx::types::Json(&response.headers))
    .bind(&response.body)
    .bind(ttl.as_secs_f64())
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// [`reap`] with the pool by value: the shape a service's periodic purge
/// task calls (every few seconds: `service_kit::periodic::PURGE_EVERY`).
pub async fn reap_from(pool: PgPool, batch: i64) -> Result<u64> {
    reap(&pool, batch).await
}

/// Deletes up to `batch` expired keys; returns how many. Short statements,
/// no long locks: call it in a loop until it returns less than `batch`.
pub async fn reap(pool: &PgPool, batch: i64) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM idempotency_keys WHERE ctid IN (
             SELECT ctid FROM idempotency_keys WHERE expires_at <= now() LIMIT $1)",
    )
    .bind(batch)
    .execute(pool)
    .await?
    .rows_affected())
}

/// The counters the Idempotency-Key layer records through the [`metrics`]
/// facade (name, help). Whatever recorder the application installs
/// receives them; [`describe_metrics`] gives it their help.
pub const COUNTERS: &[(&str, &str)] = &[
    (
        "http_idempotent_replays_total",
        "Requests answered from a stored Idempotency-Key response.",
    ),
    (
        "http_idempotent_in_flight_total",
        "Requests refused because the same key was still being processed.",
    ),
];

/// Registers the help of [`COUNTERS`] with the installed `metrics` recorder
/// (call after installing it).
pub fn describe_metrics() {
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_ignores_json_formatting_but_not_content() {
        let k = FingerprintKey::for_tests();
        let a = fingerprint(&k, "POST", "/orders", br#"{"a":1,"b":2}"#);
        let b = fingerprint(&k, "POST", "/orders", b"{ \"b\": 2, \"a\": 1 }");
        let c = fingerprint(&k, "POST", "/orders", br#"{"a":1,"b":3}"#);
        let d = fingerprint(&k, "POST", "/other", br#"{"a":1,"b":2}"#);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn without_the_key_the_fingerprint_cannot_be_recomputed() {
        let body = br#"{"card":"4242424242424242"}"#;
        let a = fingerprint(
            &FingerprintKey::new(Secret::new(&"a".repeat(32)).unwrap()),
            "POST",
            "/orders",
            body,
        );
        let b = fingerprint(
            &FingerprintKey::new(Secret::new(&"b".repeat(32)).unwrap()),
            "POST",
            "/orders",
            body,
        );
        assert_ne!(a, b, "another key, another fingerprint");
        let mut plain = <Sha256 as sha2::Digest>::new();
        sha2::Digest::update(&mut plain, b"POST\0/orders\0");
        sha2::Digest::update(&mut plain, &body[..]);
        assert_ne!(a, hex::encode(sha2::Digest::finalize(plain)), "not the unkeyed hash");
    }
}
