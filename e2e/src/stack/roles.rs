//! Least privilege in the test stack, as compose's init script sets it up:
//! a database role per service — no superuser, no `CREATEDB`, no
//! `CREATEROLE` — owning only its own database, which no other role may
//! connect to; the relay's role may connect to the three participants'
//! databases, where each service grants it its outbox and nothing else
//! (`OUTBOX_RELAY_ROLE`). The bootstrap (this module, as the server's
//! superuser) creates the roles and databases; the services create nothing.
//! Tests read and write through the superuser's URL ([`Stack::db_url`]).

use std::collections::BTreeMap;

use sqlx::{Connection as _, PgConnection};

use super::{Service, Stack};

/// The databases and their owners.
pub(super) const OWNED: [(Service, &str); 4] = [
    (Service::OrderApi, "orders"),
    (Service::Inventory, "inventory"),
    (Service::Payment, "payments"),
    (Service::Gateway, "gateway"),
];

/// The databases whose outbox the relay publishes.
pub(super) const RELAYED: [&str; 3] = ["orders", "inventory", "payments"];

/// What a database the stack made says of itself (`COMMENT ON DATABASE`):
/// one without it was made by someone else, and is not taken over unasked.
pub(super) const MARK: &str = "made by the effectively-once stack (e2e/src/stack/roles.rs)";

/// The services' roles of one stack: name and password, per service; and
/// whether the stack may take over databases it did not make.
pub(super) struct Roles(BTreeMap<Service, (String, String)>, bool);

/// `name` quoted as an SQL identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Roles {
    /// Roles named after the stack's database prefix (roles are the whole
    /// server's: two stacks on one server never share one). `adopt`: see
    /// [`Roles::bootstrap`].
    pub(super) fn new(db_prefix: &str, adopt: bool) -> Self {
        let prefix = if db_prefix.is_empty() { "eo" } else { db_prefix };
        Self(
            Service::ALL
                .into_iter()
                .filter(|s| *s != Service::Broker)
                .map(|s| {
                    let name = format!("{prefix}_{}", s.name().replace('-', "_"));
                    (s, (name, uuid::Uuid::new_v4().simple().to_string()))
                })
                .collect(),
            adopt,
        )
    }

    /// The role of `s`, if it has one.
    pub(super) fn name(&self, s: Service) -> Option<&str> {
        self.0.get(&s).map(|(name, _)| name.as_str())
    }

    /// Every role's name.
    pub(super) fn all(&self) -> Vec<String> {
        self.0.values().map(|(name, _)| name.clone()).collect()
    }

    /// `admin_url` (the superuser's, on the server) as `s`'s role, on `db`.
    pub(super) fn url(&self, admin_url: &str, s: Service, db: &str) -> String {
        let (scheme, rest) = admin_url.split_once("://").unwrap_or(("postgres", admin_url));
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let host = host.split('/').next().unwrap_or(host);
        let (name, password) = &self.0[&s];
        format!("{scheme}://{name}:{password}@{host}/{db}")
    }

    /// Creates (or, for a stack started again on its databases, resets) the
    /// roles, and each database owned by its service's role with `CONNECT`
    /// taken from everyone else; `db_name` maps a database to its full name.
    /// A database of that name that the stack did not make (no [`MARK`]) is
    /// refused, unless the roles were made to adopt: then it is taken over
    /// and marked.
    pub(super) async fn bootstrap(&self, admin_url: &str, db_name: impl Fn(&str) -> String) -> anyhow::Result<()> {
        let adopt = self.1;
        let mut admin = PgConnection::connect(&format!("{}/postgres", admin_url.trim_end_matches('/'))).await?;
        for (name, password) in self.0.values() {
            let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                .bind(name)
                .fetch_one(&mut admin)
                .await?;
            let verb = if exists { "ALTER" } else { "CREATE" };
            // A password is a literal in ROLE statements: it is hex here.
            sqlx::query(&format!(
                "{verb} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD '{}'",
                ident(name),
                password
            ))
            .execute(&mut admin)
            .await?;
        }
        // The group the server's Unix socket lets in with a password
        // (another stack may be creating it at the same moment).
        let group = testkit::postgres::SERVICE_GROUP;
        sqlx::query(&format!(
            "DO $$ BEGIN CREATE ROLE {group} NOLOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        ))
        .execute(&mut admin)
        .await?;
        for (name, _) in self.0.values() {
            sqlx::query(&format!("GRANT {group} TO {}", ident(name)))
                .execute(&mut admin)
                .await?;
        }
        for (s, db) in OWNED {
            let (db, role) = (db_name(db), &self.0[&s].0);
            let owner = ident(role);
            let found: Option<Option<String>> =
                sqlx::query_scalar("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1")
                    .bind(&db)
                    .fetch_optional(&mut admin)
                    .await?;
            if let Some(comment) = found {
                anyhow::ensure!(
                    adopt || comment.as_deref() == Some(MARK),
                    "database {db} exists and this project's stack did not make it: taking it over would \
                     change its owner and grants. `cargo xtask up --adopt` takes it over (a database an \
                     earlier version of `up` made needs this once); otherwise drop it, or set PG_BASE_URL \
                     to another server"
                );
                sqlx::query(&format!("ALTER DATABASE {} OWNER TO {owner}", ident(&db)))
                    .execute(&mut admin)
                    .await?;
                self.own_tables(admin_url, &db, role).await?;
            } else {
                sqlx::query(&format!("CREATE DATABASE {} OWNER {owner}", ident(&db)))
                    .execute(&mut admin)
                    .await?;
            }
            sqlx::query(&format!("COMMENT ON DATABASE {} IS '{MARK}'", ident(&db)))
                .execute(&mut admin)
                .await?;
            sqlx::query(&format!("REVOKE ALL ON DATABASE {} FROM PUBLIC", ident(&db)))
                .execute(&mut admin)
                .await?;
        }
        for db in RELAYED {
            sqlx::query(&format!(
                "GRANT CONNECT ON DATABASE {} TO {}",
                ident(&db_name(db)),
                ident(&self.0[&Service::Relay].0)
            ))
            .execute(&mut admin)
            .await?;
        }
        admin.close().await?;
        Ok(())
    }

    /// Hands the tables of a database made before its role existed (a
    /// `cargo xtask up` of an earlier version) to that role.
    async fn own_tables(&self, admin_url: &str, db: &str, owner: &str) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect(&format!("{}/{db}", admin_url.trim_end_matches('/'))).await?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND pg_get_userbyid(c.relowner) <> $1",
        )
        .bind(owner)
        .fetch_all(&mut conn)
        .await?;
        for t in tables {
            sqlx::query(&format!("ALTER TABLE {} OWNER TO {}", ident(&t), ident(owner)))
                .execute(&mut conn)
                .await?;
        }
        conn.close().await?;
        Ok(())
    }
}

impl Stack {
    /// The full name of one service database (`orders`, `inventory`,
    /// `payments`, `gateway`): the stack's prefix and the name.
    pub fn db_name(&self, db: &str) -> String {
        match self.opts.db_prefix.as_str() {
            "" => db.to_owned(),
            prefix => format!("{prefix}_{db}"),
        }
    }

    /// Full URL of one service database, as the server's superuser: what
    /// tests read and write through.
    pub fn db_url(&self, db: &str) -> String {
        format!("{}/{}", self.opts.pg_base, self.db_name(db))
    }

    /// The database URL `s` signs in with: its own role on its own
    /// database (`db`), never the superuser's.
    pub fn service_db_url(&self, s: Service, db: &str) -> String {
        self.roles.url(&self.opts.pg_base, s, &self.db_name(db))
    }

    /// The database role of `s` (the relay's too), if it has one.
    pub fn db_role(&self, s: Service) -> Option<&str> {
        self.roles.name(s)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection as _, PgConnection};

    use super::{ident, Roles, MARK, OWNED};

    /// Drops the test's databases and roles however it ends.
    struct Cleanup(String, Vec<String>, Vec<String>);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            testkit::db::drop_databases_blocking(std::mem::take(&mut self.1));
            testkit::db::drop_roles_blocking(self.0.clone(), std::mem::take(&mut self.2));
        }
    }

    /// A database of the stack's name that someone else made stops the
    /// bootstrap, named; `adopt` takes it over and marks it, and the stack's
    /// own databases (marked) are taken again without asking.
    #[tokio::test]
    async fn a_database_the_stack_did_not_make_is_taken_over_only_when_asked() {
        testkit::postgres::ensure().await.unwrap();
        let server = testkit::db::server_url();
        let prefix = format!("eo_adopt_{}", uuid::Uuid::new_v4().simple());
        let name = |d: &str| format!("{prefix}_{d}");
        let mut admin = PgConnection::connect(&format!("{server}/postgres")).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {}", ident(&name("orders"))))
            .execute(&mut admin)
            .await
            .unwrap();
        let (roles, adopting) = (Roles::new(&prefix, false), Roles::new(&prefix, true));
        let _cleanup = Cleanup(
            server.clone(),
            OWNED.map(|(_, d)| format!("{server}/{}", name(d))).to_vec(),
            roles.all(),
        );

        let refused = roles.bootstrap(&server, name).await.unwrap_err().to_string();
        assert!(
            refused.contains(&name("orders")) && refused.contains("--adopt"),
            "{refused}"
        );

        adopting.bootstrap(&server, name).await.unwrap();
        let comment: Option<String> =
            sqlx::query_scalar("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1")
                .bind(name("orders"))
                .fetch_one(&mut admin)
                .await
                .unwrap();
        assert_eq!(comment.as_deref(), Some(MARK));
        roles.bootstrap(&server, name).await.unwrap();

        admin.close().await.unwrap();
    }
}
