//! A keyed request in one statement: the key, the work and the answer
//! written by one round trip to PostgreSQL, for work whose answer is known
//! before it is written (an insert whose ids the service mints).
//!
//! [`crate::begin`] … [`crate::complete`] takes at least four round trips:
//! `BEGIN`, the claim, the work, the stored answer, `COMMIT`. When the
//! answer does not depend on what the database says, the same guarantee
//! fits one statement:
//!
//! ```sql
//! WITH k AS (INSERT INTO idempotency_keys … ON CONFLICT (scope, key) DO NOTHING RETURNING 1),
//!      w AS (INSERT INTO things … SELECT … FROM k RETURNING …)   -- the work, only if the key is new
//! SELECT count(*) FROM w
//! ```
//!
//! The key's row is the work's guard: each of the work's inserts selects
//! from `k`, which has a row only when this statement inserted the key.
//! One statement is one transaction: the key, the work and the answer are
//! durable together or not at all, as in the longer flow. A concurrent
//! request with the same key waits on the key's unique index until this
//! one commits, and then finds it taken.
//!
//! A taken key — completed (a replay), in flight under the longer flow,
//! expired, or another request's — is not this path's to judge: the
//! statement does nothing, and the caller runs [`crate::begin`], which
//! answers it as the table in the crate's documentation says.

use std::time::Duration;

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;

use crate::{Keyed, StoredResponse};

/// The statement's first common table expression, `k`: the key and its
/// answer inserted when the key is new. It takes parameters `$1` … `$7`
/// ([`bind`]); the work's parameters start at [`FIRST_WORK_PARAMETER`].
pub const KEY_CTE: &str = "k AS (
    INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, headers, body, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING 1)";

/// The number of the work's first parameter (`$8`).
pub const FIRST_WORK_PARAMETER: usize = 8;

/// Binds [`KEY_CTE`]'s parameters to a statement that begins with it: the
/// request's scope, key and fingerprint, the answer and how long to keep it.
/// Bind the work's parameters after these.
pub fn bind<'q>(
    statement: Query<'q, Postgres, PgArguments>,
    request: Keyed<'q>,
    ttl: Duration,
    response: &'q StoredResponse,
) -> Query<'q, Postgres, PgArguments> {
    statement
        .bind(request.scope)
        .bind(request.key)
        .bind(request.fingerprint)
        .bind(response.status as i16)
        .bind(sqlx::types::Json(&response.headers))
        .bind(&response.body)
        .bind(ttl.as_secs_f64())
}
