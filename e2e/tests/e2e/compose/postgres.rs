//! compose's PostgreSQL as docker/postgres-init.sh leaves it, run against a
//! server of this test's own (no Docker engine here): a role per service
//! owning its one database, the relay's role on the participants' three,
//! TLS with gen-env.sh's certificate and no plain TCP — and the services'
//! URLs in docker-compose.yml use exactly that.

use std::os::unix::process::CommandExt as _;
use std::process::Command;

use sqlx::Connection as _;

use super::{compose, gen_env_into};

/// (service, its role, its database) as compose and the init script name them.
const SERVICES: [(&str, &str, &str); 4] = [
    ("order-api", "order_api", "orders"),
    ("inventory-service", "inventory_service", "inventory"),
    ("payment-service", "payment_service", "payments"),
    ("mock-gateway", "mock_gateway", "gateway"),
];
const TLS: &str = "sslmode=verify-full&sslrootcert=/etc/eo/tls/ca.pem";

/// Removals tried: the `hostnossl … reject` line out of the init script —
/// a plain connection is let in; `REVOKE ALL ON DATABASE` out — order-api's
/// role reaches the gateway's database. Each time this failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_postgres_has_a_role_per_service_and_serves_tls_only() {
    let doc = compose();
    let env = |service: &str, var: &str| {
        doc["services"][service]["environment"][var]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    for (service, role, db) in SERVICES {
        let url = env(service, "DATABASE_URL");
        assert!(url.starts_with(&format!("postgres://{role}:${{")), "{service}: {url}");
        assert!(url.ends_with(&format!("@postgres:5432/{db}?{TLS}")), "{service}: {url}");
        if service != "mock-gateway" {
            assert_eq!(env(service, "OUTBOX_RELAY_ROLE"), "outbox_relay", "{service}");
        }
    }
    let relay = env("outbox-relay", "OUTBOX_DATABASE_URLS");
    let urls: Vec<&str> = relay.split(',').collect();
    assert_eq!(urls.len(), 3, "{relay}");
    for (url, db) in urls.iter().zip(["orders", "inventory", "payments"]) {
        assert!(url.starts_with("postgres://outbox_relay:${"), "{url}");
        assert!(url.ends_with(&format!("@postgres:5432/{db}?{TLS}")), "{url}");
    }

    // gen-env.sh's files, then the init script on a fresh server, as the
    // postgres image runs it (as postgres, PGDATA set), and a restart.
    let dir = std::env::temp_dir().join(format!("eo-compose-pg-{}", uuid::Uuid::new_v4().simple()));
    let tls = dir.join("tls");
    gen_env_into(&tls);
    let mut pg = testkit::postgres::cluster::Cluster::create(&dir.join("pg"), "").unwrap();
    pg.start().await.unwrap();
    let (uid, gid) = testkit::postgres::cluster::Cluster::owner().unwrap();
    let init = Command::new("sh")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/postgres-init.sh"))
        .env("PGDATA", pg.data_dir())
        .env("PGHOST", pg.socket_dir())
        .env("PGPORT", pg.port().to_string())
        .env("TLS_DIR", &tls)
        .envs(
            ["ORDER_API", "INVENTORY", "PAYMENT", "GATEWAY", "RELAY"]
                .map(|s| (format!("{s}_DB_PASSWORD"), format!("{}-password", s.to_lowercase()))),
        )
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}{}",
        String::from_utf8_lossy(&init.stdout),
        String::from_utf8_lossy(&init.stderr)
    );
    pg.stop().unwrap();
    pg.start().await.unwrap();

    let ca = tls.join("ca.pem").display().to_string();
    let url = |role: &str, db: &str, mode: &str| {
        format!(
            "postgres://{role}:x@127.0.0.1:{}/{db}?sslmode={mode}&sslrootcert={ca}",
            pg.port()
        )
    };
    // Over TLS, verified against gen-env.sh's CA, each role reaches its own
    // database — and only that one.
    for (_, role, own) in SERVICES {
        for (_, _, db) in SERVICES {
            let got = crate::sqlstate(sqlx::PgConnection::connect(&url(role, db, "verify-full")).await);
            assert_eq!(got == "ok", db == own, "{role} → {db}: {got}");
        }
    }
    for (_, _, db) in SERVICES {
        let got = crate::sqlstate(sqlx::PgConnection::connect(&url("outbox_relay", db, "verify-full")).await);
        assert_eq!(got == "ok", db != "gateway", "outbox_relay → {db}: {got}");
    }
    let mut order_api = sqlx::PgConnection::connect(&url("order_api", "orders", "verify-full"))
        .await
        .unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut order_api)
        .await
        .unwrap();
    assert!(ssl, "the connection is encrypted");
    let attrs: Vec<(String, bool, bool, bool)> = sqlx::query_as(
        "SELECT rolname::text, rolsuper, rolcreatedb, rolcreaterole FROM pg_roles
         WHERE rolname IN ('order_api', 'inventory_service', 'payment_service', 'mock_gateway', 'outbox_relay')",
    )
    .fetch_all(&mut order_api)
    .await
    .unwrap();
    assert_eq!(attrs.len(), 5, "{attrs:?}");
    assert!(attrs.iter().all(|(_, s, d, r)| !s && !d && !r), "{attrs:?}");
    // Plain TCP is refused, and a server whose certificate another CA
    // signed is not trusted.
    let plain = crate::sqlstate(sqlx::PgConnection::connect(&url("order_api", "orders", "disable")).await);
    assert_eq!(plain, "28000", "a connection without TLS: {plain}");
    let other = testkit::tls::Authority::generate("another CA").unwrap();
    std::fs::write(dir.join("other-ca.pem"), &other.cert_pem).unwrap();
    let foreign = format!(
        "postgres://order_api:x@127.0.0.1:{}/orders?sslmode=verify-full&sslrootcert={}",
        pg.port(),
        dir.join("other-ca.pem").display()
    );
    assert!(
        sqlx::PgConnection::connect(&foreign).await.is_err(),
        "verified against a CA that did not sign the server's certificate"
    );
    drop(pg);
    std::fs::remove_dir_all(&dir).unwrap();
}
