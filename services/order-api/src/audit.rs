//! The audit trail: who did what, when, from where, in `audit_log` — a
//! failed authentication, a refusal, an API key created or revoked — kept
//! for `AUDIT_RETENTION_DAYS` and read by people (`order-api audit`).
//!
//! A flood must not become a flood of writes: a failed authentication is
//! written only when its key was looked up in the database (a key answered
//! from memory was written when it was looked up), and in the lookup's own
//! statement; a refusal is written once per (actor, reason) a minute — the
//! count is `api_refusals_total`.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

/// Refusals written at most once per (actor, reason) in this window.
pub const REFUSALS_EVERY: Duration = Duration::from_secs(60);

/// One event of the trail.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Event {
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
    /// Who: a client id, `operator`, or `unknown`.
    pub actor: String,
    /// What: `auth.failed`, `refused`, `api_key.created`, `api_key.revoked`.
    pub action: String,
    /// On what: a key's id, a key's digest prefix, a refusal's reason.
    pub subject: Option<String>,
    /// From where: the remote address, or `cli`.
    pub source: Option<String>,
    /// More, in a line.
    pub detail: Option<String>,
}

/// Records one event on `conn`.
pub async fn record(
    conn: &mut PgConnection,
    actor: &str,
    action: &str,
    subject: Option<&str>,
    source: Option<&str>,
    detail: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO audit_log (actor, action, subject, source, detail) VALUES ($1, $2, $3, $4, $5)")
        .bind(actor)
        .bind(action)
        .bind(subject)
        .bind(source)
        .bind(detail)
        .execute(conn)
        .await
        .map(|_| ())
}

/// The newest `limit` events, newest first.
pub async fn recent(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as("SELECT at, actor, action, subject, source, detail FROM audit_log ORDER BY id DESC LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
        .await
}

/// Deletes up to `batch` events older than `retention`; how many.
pub async fn purge(conn: &mut PgConnection, retention: Duration, batch: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM audit_log WHERE id IN (
             SELECT id FROM audit_log WHERE at < now() - make_interval(secs => $1) ORDER BY id LIMIT $2)",
    )
    .bind(retention.as_secs_f64())
    .bind(batch)
    .execute(conn)
    .await?
    .rows_affected())
}

/// The refusals written this window, so that each (actor, reason) is
/// written once per [`REFUSALS_EVERY`].
#[derive(Clone)]
pub struct Refusals {
    seen: moka::sync::Cache<(String, &'static str), ()>,
    pool: PgPool,
}

impl Refusals {
    /// Refusals recorded on `pool`.
    pub fn new(pool: PgPool) -> Self {
        let seen = moka::sync::Cache::builder()
            .max_capacity(100_000)
            .time_to_live(REFUSALS_EVERY)
            .build();
        Self { seen, pool }
    }

    /// Records a refusal of `actor` for `reason` from `source`, unless one
    /// was recorded this window; in the background, so the refusal's answer
    /// does not wait for it.
    pub fn refused(&self, actor: &str, reason: &'static str, source: Option<std::net::IpAddr>) {
        let key = (actor.to_owned(), reason);
        if self.seen.contains_key(&key) {
            return;
        }
        self.seen.insert(key, ());
        let (pool, actor) = (self.pool.clone(), actor.to_owned());
        tokio::spawn(async move {
            let source = source.map(|s| s.to_string());
            let detail =
                format!("the first of this minute; every one is counted in api_refusals_total{{reason=\"{reason}\"}}");
            let written = async {
                let mut conn = pool.acquire().await?;
                record(
                    &mut conn,
                    &actor,
                    "refused",
                    Some(reason),
                    source.as_deref(),
                    Some(&detail),
                )
                .await
            };
            if let Err(e) = written.await {
                tracing::warn!(error = %e, "audit: a refusal not recorded");
            }
        });
    }
}
