//! Database-per-service bootstrap: the service's database is created when
//! missing, then the migrators it names run in order.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::{Error, Result};

/// The PostgreSQL server (no database) that tests, benches and the e2e
/// harness create their databases on: `$PG_BASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432`.
pub fn server_url() -> String {
    std::env::var("PG_BASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A uniquely named database for one test or bench, dropped (with whatever
/// is still connected to it) when this value is, also when the test panics.
/// [`connect`] to [`TempDb::url`] creates it.
#[derive(Debug)]
pub struct TempDb {
    url: String,
}

impl TempDb {
    /// Names a fresh database `<prefix>_<random>` on [`server_url`].
    pub fn new(prefix: &str) -> Self {
        Self {
            url: format!("{}/{prefix}_{}", server_url(), uuid::Uuid::new_v4().simple()),
        }
    }

    /// Its connection URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        drop_databases_blocking(vec![std::mem::take(&mut self.url)]);
    }
}

/// Drops the databases named in `urls` from synchronous code such as a
/// `Drop` (which may run on a runtime's thread and must not block on another
/// runtime there: the work gets a thread of its own). Failures are reported
/// on stderr, not raised.
pub fn drop_databases_blocking(urls: Vec<String>) {
    let failures = std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => return vec![e.to_string()],
        };
        rt.block_on(async {
            let mut failures = Vec::new();
            for url in &urls {
                if let Err(e) = drop_database(url).await {
                    failures.push(e.to_string());
                }
            }
            failures
        })
    })
    .join()
    .unwrap_or_default();
    for e in failures {
        eprintln!("could not drop a temporary database: {e}");
    }
}

/// Creates the database named in `url` if it does not exist yet.
///
/// Connects to the server's `postgres` database to do so; a concurrent
/// creation by another process is tolerated.
pub async fn ensure_database(url: &str) -> Result<()> {
    let opts = parse(url)?;
    let name = opts.get_database().unwrap_or("postgres").to_owned();
    let mut admin = PgConnection::connect_with(&opts.clone().database("postgres")).await?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&name)
        .fetch_one(&mut admin)
        .await?;
    if !exists {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        match sqlx::query(&sql).execute(&mut admin).await {
            Ok(_) => tracing::info!(database = %name, "created database"),
            // 42P04 duplicate_database, 23505 when two creators race on pg_database.
            Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
            Err(e) => return Err(e.into()),
        }
    }
    admin.close().await?;
    Ok(())
}

/// Drops the database named in `url` (tests clean up after themselves).
pub async fn drop_database(url: &str) -> Result<()> {
    let opts = parse(url)?;
    let name = opts.get_database().unwrap_or("postgres").to_owned();
    let mut admin = PgConnection::connect_with(&opts.database("postgres")).await?;
    let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", name.replace('"', "\"\""));
    sqlx::query(&sql).execute(&mut admin).await?;
    admin.close().await?;
    Ok(())
}

fn parse(url: &str) -> Result<PgConnectOptions> {
    PgConnectOptions::from_str(url)
        .map(|o| o.disable_statement_logging())
        .map_err(|source| Error::DatabaseUrl {
            url: url.to_owned(),
            source,
        })
}

/// Creates the database if needed, opens a pool and runs `migrators` in order.
///
/// Each library crate (outbox, inbox, idempotency) owns its tables and ships
/// its own migrator with a version range of its own, so every migrator runs
/// with `ignore_missing`: the others' rows in `_sqlx_migrations` are expected.
pub async fn connect(url: &str, max_connections: u32, migrators: Vec<Migrator>) -> Result<PgPool> {
    ensure_database(url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(parse(url)?)
        .await?;
    for mut migrator in migrators {
        migrator.set_ignore_missing(true);
        migrator.run(&pool).await?;
    }
    Ok(pool)
}
