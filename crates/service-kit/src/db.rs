//! Database-per-service bootstrap: the service's database is created when
//! missing, then the migrators it names run in order.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::{Error, Result};

/// Creates the database named in `url` if it does not exist yet.
///
/// Connects to the database itself first: a deployment's bootstrap
/// (compose's init script, the test stack) creates it and its owner, and
/// a service's role — no `CREATEDB`, no `CONNECT` on other databases —
/// never touches the server's `postgres` database. Only when the database
/// does not exist (3D000: local development with a superuser's URL) is it
/// created from there; a concurrent creation by another process is tolerated.
pub async fn ensure_database(url: &str) -> Result<()> {
    let opts = parse(url)?;
    match PgConnection::connect_with(&opts).await {
        Ok(conn) => return Ok(conn.close().await?),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {}
        Err(e) => return Err(e.into()),
    }
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

/// Parses a database URL (as `PgConnectOptions` understands it).
pub fn parse(url: &str) -> Result<PgConnectOptions> {
    PgConnectOptions::from_str(url)
        .map(|o| o.disable_statement_logging())
        .map_err(|source| Error::DatabaseUrl {
            url: redact(url),
            source,
        })
}

/// `url` with its password replaced by `***`, for errors and logs:
/// `postgres://app:secret@db/orders` → `postgres://app:***@db/orders`.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!("{}{}:***{}", &url[..scheme_end], &rest[..colon], &rest[at..]),
        None => url.to_owned(),
    }
}

/// Creates the database if needed, opens a pool and runs `migrators` in order.
///
/// Each library crate (outbox, inbox, idempotency) owns its tables and ships
/// its own migrator with a version range of its own, so every migrator runs
/// with `ignore_missing`: the others' rows in `_sqlx_migrations` are expected.
pub async fn connect(url: &str, max_connections: u32, migrators: Vec<Migrator>) -> Result<PgPool> {
    ensure_database(url).await?;
    tracing::debug!(database = %database_name(url)?, max_connections, "connecting");
    let pool = pool_options(max_connections).connect_with(parse(url)?).await?;
    for mut migrator in migrators {
        migrator.set_ignore_missing(true);
        migrator.run(&pool).await?;
    }
    Ok(pool)
}

/// A further pool on a database [`connect`] already created and migrated:
/// a bulkhead, so one kind of work (a service's consumer, say) never waits
/// for connections behind another (its HTTP requests).
pub async fn pool(url: &str, max_connections: u32) -> Result<PgPool> {
    Ok(pool_options(max_connections).connect_with(parse(url)?).await?)
}

/// A pool on a database another process creates and migrates (the
/// outbox relay's on a service's): no connection is opened until one is
/// needed, so the process starts whether or not the database exists yet.
pub fn pool_lazy(url: &str, max_connections: u32) -> Result<PgPool> {
    Ok(pool_options(max_connections).connect_lazy_with(parse(url)?))
}

/// A pooled connection idle at least this long is pinged before it is
/// handed out; one used more recently is handed out as it is.
///
/// sqlx's default pings every connection on every acquire: a round trip
/// more per transaction in every service (measured:
/// docs/results/code-decisions.md), and two round trips instead of one for
/// each of an idle relay's probes for pending rows. A connection used within the last second was alive
/// then; if it has died since, its statement fails like one killed
/// mid-transaction, and every caller already retries those (a client with
/// its Idempotency-Key, a consumer by redelivery, the relay by its next
/// claim). HikariCP's `aliveBypassWindowMs` (500 ms) is the same rule.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The pool settings of every service: at most `max_connections`, an
/// acquire that waits up to 10 s, and a ping only for a connection idle for
/// [`PING_IF_IDLE_FOR`].
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IF_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

/// The database name in `url` (`postgres` when it names none).
pub fn database_name(url: &str) -> Result<String> {
    Ok(parse(url)?.get_database().unwrap_or("postgres").to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_name_comes_from_the_url_parser() {
        assert_eq!(
            database_name("postgres://u@h:5432/orders?sslmode=disable").unwrap(),
            "orders"
        );
        assert_eq!(database_name("postgres://u@h").unwrap(), "postgres");
        assert!(database_name("not a url").is_err());
    }

    #[test]
    fn a_password_never_shows_in_an_error() {
        assert_eq!(
            redact("postgres://app:s3cr%40t@db:5432/orders"),
            "postgres://app:***@db:5432/orders"
        );
        assert_eq!(redact("postgres://app@db/orders"), "postgres://app@db/orders");
        assert_eq!(redact("postgres://db/orders?user=a"), "postgres://db/orders?user=a");
        let e = parse("postgres://app:hunter2@db:notaport/orders")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
