//! PostgreSQL least privilege, read from the server: every service signs in
//! under a role of its own that owns its database and nothing else; the
//! relay's role reaches the participants' outboxes and nothing beside them;
//! no role may create a database or a role; and the saga runs end to end so.

use e2e::Service;
use sqlx::Connection;

const DATABASES: [&str; 4] = ["orders", "inventory", "payments", "gateway"];

/// Removals tried: `REVOKE ALL ON DATABASE … FROM PUBLIC` out of the
/// bootstrap — order-api's role connects to the gateway's database; the
/// relay's grant widened to every table (`GRANT SELECT ON ALL TABLES`) —
/// it reads the orders. Each time this failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_role_reaches_its_own_database_only() {
    let stack = crate::stack("privileges").await;
    // The saga runs under these roles: an order ends CONFIRMED (the relay
    // published from the outboxes it was granted).
    crate::one_confirmed_order(&stack).await;

    let mut admin = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
    let mut matrix = Vec::new();
    for s in Service::ALL.into_iter().filter(|s| *s != Service::Broker) {
        let role = stack.db_role(s).expect("every service has a role").to_owned();
        let attrs: (bool, bool, bool, bool, bool) = sqlx::query_as(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles WHERE rolname = $1",
        )
        .bind(&role)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!(
            attrs,
            (false, false, false, false, false),
            "{role}: superuser, createdb, createrole, replication, bypassrls"
        );
        for db in DATABASES {
            let reached = crate::sqlstate(sqlx::PgConnection::connect(&stack.service_db_url(s, db)).await);
            matrix.push(format!("{} → {db}: {reached}", s.name()));
            let own = match s {
                Service::OrderApi => db == "orders",
                Service::Inventory => db == "inventory",
                Service::Payment => db == "payments",
                Service::Gateway => db == "gateway",
                _ => db != "gateway",
            };
            assert_eq!(reached == "ok", own, "{} connecting to {db}: {reached}", s.name());
            // 42501: insufficient privilege (CONNECT revoked from PUBLIC).
            if !own {
                assert_eq!(reached, "42501", "{} on {db}", s.name());
            }
        }
    }
    // Inside the orders database, the relay reads and settles the outbox and
    // nothing else: not the orders, not the idempotency keys, and it cannot
    // write an event of its own.
    let mut relay = sqlx::PgConnection::connect(&stack.service_db_url(Service::Relay, "orders"))
        .await
        .unwrap();
    for (sql, expected) in [
        ("SELECT count(*) FROM outbox", "ok"),
        ("SELECT count(*) FROM outbox_published", "ok"),
        ("SELECT count(*) FROM orders", "42501"),
        ("SELECT count(*) FROM idempotency_keys", "42501"),
        ("SELECT count(*) FROM inbox", "42501"),
        (
            "INSERT INTO outbox (event_id, topic, message_key, envelope, event_type)
             VALUES (gen_random_uuid(), 't', 'k', '{}', 'Forged')",
            "42501",
        ),
        ("CREATE TABLE relay_was_here (id int)", "42501"),
    ] {
        let got = crate::sqlstate(sqlx::query(sql).execute(&mut relay).await);
        matrix.push(format!("outbox-relay in orders: {sql} → {got}"));
        assert_eq!(got, expected, "the relay: {sql}");
    }
    // A service may not create a database (the bootstrap does).
    let mut order_api = sqlx::PgConnection::connect(&stack.service_db_url(Service::OrderApi, "orders"))
        .await
        .unwrap();
    let created = crate::sqlstate(
        sqlx::query("CREATE DATABASE order_api_was_here")
            .execute(&mut order_api)
            .await,
    );
    assert_eq!(created, "42501", "order-api creating a database");
    println!(
        "access matrix (role → database: SQLSTATE or ok):\n{}",
        matrix.join("\n")
    );
    stack.shutdown(true).await.unwrap();
}
