//! Where PostgreSQL's time went in a trial: the top statements of
//! `pg_stat_statements` by execution time, over every database of the
//! server, reset when the trial starts. Only when the server preloads the
//! module (`shared_preload_libraries = 'pg_stat_statements'`, a restart):
//! otherwise a trial has no statements and the report says how to get them.
//!
//! Execution time is wall time inside the server (lock waits and reads
//! included), not CPU; a statement's share of the whole is what tells where
//! to look.

use serde::Serialize;
use sqlx::{Connection as _, PgConnection};

/// One normalised statement over a trial.
#[derive(Debug, Clone, Serialize)]
pub struct Statement {
    /// The database it ran in.
    pub database: String,
    /// Its text, normalised by the module, whitespace folded, cut to 200 characters.
    pub query: String,
    /// Calls per order.
    pub calls_per_order: f64,
    /// Execution time per order, ms.
    pub ms_per_order: f64,
    /// Share of all statements' execution time.
    pub share: f64,
    /// WAL bytes per order.
    pub wal_bytes_per_order: f64,
}

/// Starts the count over; `false` when the server does not preload the module.
pub async fn reset(url: &str) -> bool {
    async {
        let mut db = PgConnection::connect(url).await?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut db)
            .await?;
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&mut db)
            .await?;
        db.close().await?;
        anyhow::Ok(())
    }
    .await
    .is_ok()
}

/// The `n` statements that took the most execution time since [`reset`].
pub async fn top(url: &str, orders: usize, n: i64) -> anyhow::Result<Vec<Statement>> {
    let mut db = PgConnection::connect(url).await?;
    let rows: Vec<(String, String, i64, f64, f64, f64)> = sqlx::query_as(
        "SELECT d.datname::text, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 200), s.calls,
                s.total_exec_time, s.wal_bytes::float8,
                sum(s.total_exec_time) OVER ()
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
         ORDER BY s.total_exec_time DESC LIMIT $1",
    )
    .bind(n)
    .fetch_all(&mut db)
    .await?;
    db.close().await?;
    let per = orders.max(1) as f64;
    Ok(rows
        .into_iter()
        .map(|(database, query, calls, ms, wal, all)| Statement {
            database,
            query,
            calls_per_order: calls as f64 / per,
            ms_per_order: ms / per,
            share: ms / all.max(f64::EPSILON),
            wal_bytes_per_order: wal / per,
        })
        .collect())
}
