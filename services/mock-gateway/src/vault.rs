//! The card vault: `POST /v1/tokens` turns a card number into a token, and
//! charges name the token. Merchants (order-api) keep the token and the
//! last four digits; the number itself is stored nowhere — not here either:
//! the vault keeps an HMAC fingerprint (to give a card its existing token)
//! and the mock issuer's decision for the card.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::PgPool;

use crate::ledger::GatewayError;
use crate::AppState;

pub use gateway_client::api::{CardToken, TokenRequest};

fn fingerprint(vault_key: &[u8], card: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(vault_key).expect("HMAC takes a key of any length");
    mac.update(card.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// A short id of a vault key, stored beside each fingerprint made under it:
/// the first 16 hex digits of an HMAC of a fixed label under the key — it
/// names the key without revealing it.
pub fn key_id(vault_key: &[u8]) -> String {
    fingerprint(vault_key, "effectively-once vault key id")[..16].to_owned()
}

/// Cards by the key their fingerprint was made under.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ByKey {
    /// Under the current key.
    pub current: i64,
    /// Under the previous key: they keep their token only while
    /// `GATEWAY_VAULT_KEY_PREVIOUS` is given; it may be retired at 0.
    pub previous: i64,
    /// Made before the vault recorded keys, or under an older key.
    pub other: i64,
}

/// How many cards the vault holds under each key.
pub async fn cards_by_key(pool: &PgPool, vault_key: &[u8], previous: Option<&[u8]>) -> sqlx::Result<ByKey> {
    let (current, previous) = (key_id(vault_key), previous.map(key_id));
    let (current, previous, other): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE key_id = $1),
                count(*) FILTER (WHERE key_id = $2),
                count(*) FILTER (WHERE key_id IS DISTINCT FROM $1 AND key_id IS DISTINCT FROM $2)
         FROM card_tokens",
    )
    .bind(&current)
    .bind(previous)
    .fetch_one(pool)
    .await?;
    Ok(ByKey {
        current,
        previous,
        other,
    })
}

/// Whether `card` looks like a card number (12..=19 ASCII digits).
pub fn is_card_number(card: &str) -> bool {
    (12..=19).contains(&card.len()) && card.bytes().all(|b| b.is_ascii_digit())
}

/// The token of `card`, minted on first sight (one per card). While the
/// vault key is rotated, a card fingerprinted under `previous` is re-keyed
/// to `vault_key` first, and keeps its token.
pub async fn tokenise(
    pool: &PgPool,
    vault_key: &[u8],
    previous: Option<&[u8]>,
    card: &str,
) -> Result<CardToken, GatewayError> {
    if !is_card_number(card) {
        return Err(GatewayError::Unprocessable("card must be 12..=19 digits".into()));
    }
    let fp = fingerprint(vault_key, card);
    if let Some(previous) = previous {
        sqlx::query(
            "UPDATE card_tokens SET fingerprint = $1, key_id = $3 WHERE fingerprint = $2
             AND NOT EXISTS (SELECT 1 FROM card_tokens WHERE fingerprint = $1)",
        )
        .bind(&fp)
        .bind(fingerprint(previous, card))
        .bind(key_id(vault_key))
        .execute(pool)
        .await?;
    }
    let last4 = card[card.len() - 4..].to_owned();
    let minted = format!("tok_{}", uuid::Uuid::new_v4().simple());
    // Insert-or-read: concurrent first sights get one token. When another
    // transaction inserted the card first, this statement's snapshot (taken
    // before that commit) cannot see its row: read it again, in a new one.
    let inserted: Option<(String,)> = sqlx::query_as(
        "WITH ins AS (
             INSERT INTO card_tokens (token, fingerprint, last4, declines, key_id) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (fingerprint) DO NOTHING RETURNING token)
         SELECT token FROM ins UNION ALL SELECT token FROM card_tokens WHERE fingerprint = $2
         LIMIT 1",
    )
    .bind(&minted)
    .bind(&fp)
    .bind(&last4)
    .bind(card == crate::DECLINED_CARD)
    .bind(key_id(vault_key))
    .fetch_optional(pool)
    .await?;
    let (token,) = match inserted {
        Some(row) => row,
        None => {
            sqlx::query_as("SELECT token FROM card_tokens WHERE fingerprint = $1")
                .bind(&fp)
                .fetch_one(pool)
                .await?
        }
    };
    Ok(CardToken { token, last4 })
}

/// `POST /v1/tokens` — the card's token and last four digits (the same
/// token every time for one card).
#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "gateway",
    request_body = TokenRequest,
    responses(
        (status = 201, description = "The card's token", body = CardToken),
        (status = 400, description = "Malformed body", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::NoCredential,
        crate::grants::NoGrant,
        (status = 422, description = "Not a card number", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        (status = 429, description = "The caller tokenises faster than `GATEWAY_TOKENISE_PER_SEC`", body = service_kit::problem::Problem, content_type = "application/problem+json"),
        service_kit::problem::responses::Internal,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<idempotency::Scope>,
    body: axum::body::Bytes,
) -> Result<Response, GatewayError> {
    if let Err(not_until) = state.tokenise_limit.check_key(&caller.0) {
        telemetry::metrics::incr("gateway_tokenise_limited_total", &[("caller", caller.0.as_str())]);
        let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
        let mut resp = service_kit::problem::Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "/problems/rate-limited",
            "Too many tokenisations",
            "this caller tokenises cards faster than it may (GATEWAY_TOKENISE_PER_SEC)",
        )
        .into_response();
        let secs = wait.as_secs().max(1).to_string();
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_str(&secs).expect("digits"),
        );
        return Ok(resp);
    }
    let req: TokenRequest = crate::ledger::parse(&body)?;
    let previous = state.previous_vault_key.as_ref().map(|k| k.expose().as_bytes());
    let token = tokenise(&state.pool, state.vault_key.expose().as_bytes(), previous, &req.card).await?;
    telemetry::metrics::incr("gateway_tokens_issued_total", &[]);
    Ok((StatusCode::CREATED, Json(token)).into_response())
}

/// A token bucket per caller (governor's GCRA).
pub type Limiter = governor::DefaultKeyedRateLimiter<String>;

/// `per_sec` tokenisations per caller, bursting to twice that.
pub fn limiter(per_sec: u32) -> Limiter {
    let rate = std::num::NonZeroU32::new(per_sec.max(1)).expect("at least 1");
    let burst = rate.saturating_mul(std::num::NonZeroU32::new(2).expect("2"));
    governor::RateLimiter::keyed(governor::Quota::per_second(rate).allow_burst(burst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_depends_on_the_key_and_is_not_the_number() {
        let a = fingerprint(b"k1", "4242424242424242");
        assert_eq!(a, fingerprint(b"k1", "4242424242424242"));
        assert_ne!(a, fingerprint(b"k2", "4242424242424242"));
        assert!(!a.contains("4242424242424242"));
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn card_numbers_are_twelve_to_nineteen_digits() {
        assert!(is_card_number("424242424242"));
        assert!(!is_card_number("42424242424"));
        assert!(!is_card_number("tok_abc"));
        assert!(!is_card_number("42424242424242424242"));
    }
}
