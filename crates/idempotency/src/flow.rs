//! The idempotent-request flow as a handler reads it, top to bottom, for
//! handlers that do their work in a database transaction (order-api,
//! mock-gateway):
//!
//! ```no_run
//! # use idempotency::{Begun, Keyed, StoredResponse};
//! # async fn handler(pool: &sqlx::PgPool, request: Keyed<'_>) -> Result<idempotency::Outcome, idempotency::Error> {
//! let mut tx = match idempotency::begin(pool, request).await? {
//!     Begun::New(tx) => tx,                           // the key is ours: do the work
//!     Begun::Answered(outcome) => return Ok(outcome), // a replay, in flight, or a mismatch
//! };
//! // … the effect, written with `&mut *tx` …
//! let response = StoredResponse::json(axum::http::StatusCode::CREATED, &"done", "application/json");
//! let ttl = std::time::Duration::from_secs(86_400);
//! idempotency::complete(pool, tx, request, ttl, &response).await // stored and committed with the effect
//! # }
//! ```
//!
//! Work that may fail ends with [`finish`] instead: an error that is the
//! request's final answer (a validation failure) is stored like a success;
//! any other (a dependency was down: a retry should run again) rolls `tx`
//! back at once, and the key's claim goes with it.

use std::time::Duration;

use sqlx::{Acquire, PgConnection, PgPool, Postgres, Transaction};

use crate::{claim_any, lookup_any, store, Claim, Error, StoredResponse};

/// Identity of a keyed request.
#[derive(Debug, Clone, Copy)]
pub struct Keyed<'a> {
    /// The client scope the key belongs to.
    pub scope: &'a str,
    /// The Idempotency-Key.
    pub key: &'a str,
    /// [`crate::fingerprint`] of the request.
    pub fingerprint: &'a str,
    /// Its fingerprint under the previous key while the key is rotated
    /// (matched, never stored).
    pub previous_fingerprint: Option<&'a str>,
}

impl Keyed<'_> {
    /// The fingerprints a stored key may carry to be this request's.
    fn accepted(&self) -> Vec<&str> {
        std::iter::once(self.fingerprint)
            .chain(self.previous_fingerprint)
            .collect()
    }
}

/// How a keyed request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Executed now; the response is stored and committed.
    Completed(StoredResponse),
    /// Executed before; here is the stored response.
    Replayed(StoredResponse),
    /// The first request with this key is still running.
    InFlight,
    /// The key was used for a different request.
    Mismatch,
}

/// What [`begin`] found: `'c` is the transaction's, `'static` when it
/// was begun on the pool, a connection's borrow when begun on one.
#[derive(Debug)]
pub enum Begun<'c> {
    /// The key is this request's: do the work in this transaction (which
    /// holds the key's claim), then [`complete`].
    New(Transaction<'c, Postgres>),
    /// Answered without running: a replay, in flight, or a mismatch.
    Answered(Outcome),
}

/// Opens the request's transaction and claims its key in it ([`crate::claim`]):
/// the transaction to do the work in, or the answer when the key was
/// completed, is in flight, or belongs to another request.
///
/// `conn` is the pool (a connection is taken from it) or a connection
/// already held: a handler with a deadline takes its connection within
/// it, then begins here.
pub async fn begin<'c>(conn: impl Acquire<'c, Database = Postgres>, request: Keyed<'_>) -> Result<Begun<'c>, Error> {
    let mut tx = conn.begin().await?;
    let answered = match claim_any(&mut tx, request.scope, request.key, &request.accepted()).await? {
        Claim::New => return Ok(Begun::New(tx)),
        Claim::Replay(stored) => Outcome::Replayed(stored),
        Claim::InFlight => Outcome::InFlight,
        Claim::Mismatch => Outcome::Mismatch,
    };
    // Nothing was written: end the transaction now rather than when its
    // connection is next used.
    tx.rollback().await?;
    Ok(Begun::Answered(answered))
}

/// The answer to `request` when its key is already completed — its stored
/// response, or a mismatch — without claiming it: what a handler asks
/// before work a retry must not repeat (a call out that costs, or that a
/// limit counts). `None`: the key is new or in flight; [`begin`] decides.
pub async fn answered(conn: &mut PgConnection, request: Keyed<'_>) -> Result<Option<Outcome>, Error> {
    Ok(
        match lookup_any(conn, request.scope, request.key, &request.accepted()).await? {
            Some(Claim::Replay(stored)) => Some(Outcome::Replayed(stored)),
            Some(Claim::Mismatch) => Some(Outcome::Mismatch),
            Some(Claim::New | Claim::InFlight) | None => None,
        },
    )
}

/// Stores `response` under the request's key in `tx` and commits it with
/// the work done there: [`Outcome::Completed`]. When a concurrent first
/// request completed the key after this one's claim (see [`crate::claim`]), this
/// one's work is rolled back and that request's answer returned instead.
pub async fn complete(
    pool: &PgPool,
    mut tx: Transaction<'_, Postgres>,
    request: Keyed<'_>,
    ttl: Duration,
    response: &StoredResponse,
) -> Result<Outcome, Error> {
    if store(&mut tx, request.scope, request.key, request.fingerprint, ttl, response).await? {
        tx.commit().await?;
        return Ok(Outcome::Completed(response.clone()));
    }
    tx.rollback().await?;
    let mut conn = pool.acquire().await?;
    Ok(
        match lookup_any(&mut conn, request.scope, request.key, &request.accepted()).await? {
            Some(Claim::Replay(stored)) => Outcome::Replayed(stored),
            Some(Claim::Mismatch) => Outcome::Mismatch,
            _ => Outcome::InFlight,
        },
    )
}

/// [`complete`] for work that may have failed: a success, or an error
/// `stored_error` turns into the request's final answer, is stored and
/// committed with the work; any other error rolls the transaction back
/// now — not when its connection is next used: until then the key's claim
/// is held, and a retry at once would be told "in flight" — and is
/// returned.
pub async fn finish<E: From<Error>>(
    pool: &PgPool,
    tx: Transaction<'_, Postgres>,
    request: Keyed<'_>,
    ttl: Duration,
    result: Result<StoredResponse, E>,
    stored_error: impl FnOnce(&E) -> Option<StoredResponse>,
) -> Result<Outcome, E> {
    let response = match result {
        Ok(response) => response,
        Err(e) => match stored_error(&e) {
            Some(stored) => stored,
            None => {
                let _ = tx.rollback().await;
                return Err(e);
            }
        },
    };
    Ok(complete(pool, tx, request, ttl, &response).await?)
}
