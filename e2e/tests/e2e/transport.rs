//! How the services reach PostgreSQL on one host: the local stack and the
//! bench (`StackOptions::postgres_socket`) over the server's Unix socket —
//! no TCP, no TLS handshake or encryption per connection and statement —
//! where Debian's server has `ssl = on` and sqlx's default (`prefer`)
//! would have taken TLS over loopback.

use sqlx::Connection as _;

use e2e::Service;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_stack_reaches_postgres_over_its_unix_socket_without_tls() {
    let stack = crate::stack_with("socket", |opts| opts.postgres_socket = true).await;
    let transport = stack.postgres_transport();
    assert!(transport.starts_with("unix socket /"), "{transport}");
    crate::one_confirmed_order(&stack).await;
    let roles: Vec<String> = [
        Service::OrderApi,
        Service::Inventory,
        Service::Payment,
        Service::Gateway,
        Service::Relay,
    ]
    .into_iter()
    .map(|s| stack.db_role(s).expect("a role of its own").to_owned())
    .collect();
    let mut db = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
    // Each service's open connections: a socket has no client address.
    let connections: Vec<(String, Option<String>, bool)> = sqlx::query_as(
        "SELECT a.usename::text, host(a.client_addr), coalesce(s.ssl, false)
         FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s USING (pid)
         WHERE a.usename::text = ANY($1)",
    )
    .bind(&roles)
    .fetch_all(&mut db)
    .await
    .unwrap();
    for role in &roles {
        assert!(
            connections.iter().any(|(user, _, _)| user == role),
            "{role} has no connection: {connections:?}"
        );
    }
    for (user, addr, tls) in &connections {
        assert_eq!(
            (addr.as_deref(), tls),
            (None, &false),
            "{user} connected over TCP or TLS"
        );
    }
    db.close().await.unwrap();
    stack.shutdown(true).await.unwrap();
}
