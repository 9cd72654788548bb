//! Clients' API keys, as the operator manages them (`order-api keys …`):
//! created (shown once, stored as its hash, optionally expiring), listed,
//! revoked — each change written to the audit trail in its own statement.

use chrono::{DateTime, Utc};
use rand::RngCore as _;
use sqlx::PgPool;
use uuid::Uuid;

use super::hash;

/// A new API key for `client`: its id and the key itself, which is shown
/// once and stored only as its hash. It does not expire.
pub async fn create_key(pool: &PgPool, client: &str) -> anyhow::Result<(Uuid, String)> {
    create_key_expiring(pool, client, None).await
}

/// [`create_key`] with an expiry: past `expires_at` the key opens nothing.
pub async fn create_key_expiring(
    pool: &PgPool,
    client: &str,
    expires_at: Option<DateTime<Utc>>,
) -> anyhow::Result<(Uuid, String)> {
    anyhow::ensure!(
        !client.is_empty() && client.len() <= 64 && client.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "a client id is 1..=64 printable ASCII characters"
    );
    let mut secret = [0u8; 20];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let key = format!("eo_{}", hex::encode(secret));
    let id = Uuid::now_v7();
    sqlx::query(
        "WITH k AS (
             INSERT INTO api_keys (id, client_id, key_hash, expires_at) VALUES ($1, $2, $3, $4) RETURNING id)
         INSERT INTO audit_log (actor, action, subject, source, detail)
         SELECT 'operator', 'api_key.created', k.id::text, 'cli',
                'for client ' || $2 || coalesce(', expires ' || $4::text, '')
         FROM k",
    )
    .bind(id)
    .bind(client)
    .bind(hash(&key))
    .bind(expires_at)
    .execute(pool)
    .await?;
    Ok((id, key))
}

/// Revokes key `id`; whether it was active.
pub async fn revoke_key(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    let revoked: i64 = sqlx::query_scalar(
        "WITH k AS (
             UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
             RETURNING id, client_id),
         a AS (
             INSERT INTO audit_log (actor, action, subject, source, detail)
             SELECT 'operator', 'api_key.revoked', k.id::text, 'cli', 'of client ' || k.client_id FROM k)
         SELECT count(*) FROM k",
    )
    .bind(id)
    .fetch_one(pool)
    .await?;
    Ok(revoked == 1)
}

/// One key, as `order-api keys list` shows it.
#[derive(Debug, sqlx::FromRow)]
pub struct Key {
    /// Its id.
    pub id: Uuid,
    /// Its client.
    pub client_id: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
    /// When it expires, if it does.
    pub expires_at: Option<DateTime<Utc>>,
}

/// Every key, oldest first.
pub async fn list_keys(pool: &PgPool) -> sqlx::Result<Vec<Key>> {
    sqlx::query_as("SELECT id, client_id, created_at, revoked_at, expires_at FROM api_keys ORDER BY created_at")
        .fetch_all(pool)
        .await
}
