//! Throw-away databases on the local PostgreSQL server.

use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

/// The PostgreSQL server (no database) that tests, benches and the e2e
/// harness create their databases on: `$PG_BASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432`.
pub fn server_url() -> String {
    std::env::var("PG_BASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// `url` with its password (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// A uniquely named database for one test or bench, dropped (with whatever
/// is still connected to it) when this value is, also when the test panics.
/// Connecting a service to [`TempDb::url`] creates it.
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

    /// Creates a fresh database, opens a pool of `max_connections` on it
    /// and runs `migrators` in order, missing versions ignored (several
    /// crates' migrators share one database) — as the services' bootstrap
    /// (`service_kit::db::connect`) does.
    pub async fn with_pool(
        prefix: &str,
        max_connections: u32,
        migrators: Vec<Migrator>,
    ) -> anyhow::Result<(Self, PgPool)> {
        let db = Self::new(prefix);
        let options = PgConnectOptions::from_str(&db.url)?;
        let name = options.get_database().unwrap_or_default().to_owned();
        let mut admin = PgConnection::connect_with(&options.clone().database("postgres")).await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await?;
        for mut migrator in migrators {
            migrator.set_ignore_missing(true);
            migrator.run(&pool).await?;
        }
        Ok((db, pool))
    }

    /// [`TempDb::with_pool`], then `ddl` (a test's own tables).
    pub async fn with_tables(prefix: &str, migrators: Vec<Migrator>, ddl: &str) -> anyhow::Result<(Self, PgPool)> {
        let (db, pool) = Self::with_pool(prefix, 4, migrators).await?;
        sqlx::raw_sql(ddl).execute(&pool).await?;
        Ok((db, pool))
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

/// Drops the roles `names` (if they exist) on the server at `server` (a URL
/// without a database, as [`server_url`]) — after whatever they own or were
/// granted: a role with privileges in a database that still exists cannot go.
pub async fn drop_roles(server: &str, names: &[String]) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(&format!("{}/postgres", server.trim_end_matches('/'))).await?;
    for name in names {
        sqlx::query(&format!("DROP ROLE IF EXISTS \"{}\"", name.replace('"', "\"\"")))
            .execute(&mut admin)
            .await?;
    }
    admin.close().await?;
    Ok(())
}

/// [`drop_roles`] from synchronous code such as a `Drop`, on a thread of
/// its own as [`drop_databases_blocking`]. Failures are reported on stderr.
pub fn drop_roles_blocking(server: String, names: Vec<String>) {
    let dropped = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(drop_roles(&server, &names)))
    })
    .join();
    if let Ok(Err(e)) = dropped {
        eprintln!("could not drop temporary roles: {e}");
    }
}

/// Drops the database named in `url`, disconnecting whoever is still on it.
pub async fn drop_database(url: &str) -> anyhow::Result<()> {
    let opts = PgConnectOptions::from_str(url)?.disable_statement_logging();
    let name = opts.get_database().unwrap_or("postgres").to_owned();
    let mut admin = PgConnection::connect_with(&opts.database("postgres")).await?;
    let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", name.replace('"', "\"\""));
    sqlx::query(&sql).execute(&mut admin).await?;
    admin.close().await?;
    Ok(())
}
