//! The whole idempotent-request flow in one function, for handlers that do
//! their work in a database transaction (order-api, mock-gateway).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::{begin, complete, lookup, Begin, Error, StoredResponse};

/// The work of a first execution, run inside the idempotency transaction.
pub type Work<E> = Box<
    dyn for<'c> FnOnce(&'c mut PgConnection) -> Pin<Box<dyn Future<Output = Result<StoredResponse, E>> + Send + 'c>>
        + Send,
>;

/// Identity of a keyed request.
#[derive(Debug, Clone, Copy)]
pub struct Keyed<'a> {
    /// The client scope the key belongs to.
    pub scope: &'a str,
    /// The Idempotency-Key.
    pub key: &'a str,
    /// [`crate::fingerprint`] of the request.
    pub fingerprint: &'a str,
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

/// Runs `work` at most once per `(scope, key)`, in one transaction with the
/// key row and the stored response.
///
/// When `work` fails, `stored_error` decides: `Some(response)` stores the
/// error as the request's final outcome (a retry gets it again — e.g. a
/// validation failure); `None` rolls everything back (a retry runs again —
/// e.g. a dependency was unavailable).
pub async fn execute<E>(
    pool: &PgPool,
    request: Keyed<'_>,
    ttl: Duration,
    work: Work<E>,
    stored_error: impl FnOnce(&E) -> Option<StoredResponse>,
) -> Result<Outcome, E>
where
    E: From<Error>,
{
    let mut tx = pool.begin().await.map_err(Error::from)?;
    match begin(&mut tx, request.scope, request.key, request.fingerprint).await? {
        Begin::Replay(stored) => return Ok(Outcome::Replayed(stored)),
        Begin::InFlight => return Ok(Outcome::InFlight),
        Begin::Mismatch => return Ok(Outcome::Mismatch),
        Begin::New => {}
    }
    let stored = match work(&mut tx).await {
        Ok(stored) => stored,
        Err(e) => match stored_error(&e) {
            Some(stored) => stored,
            None => {
                // Roll back now, not when the dropped transaction's connection
                // is next used: until then its key lock is held, and a retry
                // that comes at once would be told "in flight".
                let _ = tx.rollback().await;
                return Err(e);
            }
        },
    };
    if !complete(&mut tx, request.scope, request.key, request.fingerprint, ttl, &stored).await? {
        // A concurrent first request committed this key after our snapshot:
        // undo our effect and answer with its outcome.
        tx.rollback().await.map_err(Error::from)?;
        let mut conn = pool.acquire().await.map_err(Error::from)?;
        return Ok(
            match lookup(&mut conn, request.scope, request.key, request.fingerprint).await? {
                Some(Begin::Replay(stored)) => Outcome::Replayed(stored),
                Some(Begin::Mismatch) => Outcome::Mismatch,
                _ => Outcome::InFlight,
            },
        );
    }
    tx.commit().await.map_err(Error::from)?;
    Ok(Outcome::Completed(stored))
}
