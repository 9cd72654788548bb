//! The local server through its Unix socket: what the local stack and the
//! bench use on one host (`testkit::postgres::socket_url`).

use sqlx::Connection as _;

#[tokio::test]
async fn the_local_server_answers_over_its_unix_socket_and_a_remote_one_has_none() {
    testkit::postgres::ensure().await.unwrap();
    let server = testkit::db::server_url();
    let socket = testkit::postgres::socket_url(&server)
        .await
        .expect("the local server answers over its socket");
    assert!(socket.contains("@%2F"), "{socket}");
    let mut db = sqlx::PgConnection::connect(&format!("{socket}/postgres"))
        .await
        .unwrap();
    let addr: Option<String> = sqlx::query_scalar("SELECT host(inet_client_addr())")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(addr, None, "a socket has no client address");
    db.close().await.unwrap();
    assert_eq!(
        testkit::postgres::socket_url("postgres://postgres@db.example:5432").await,
        None
    );
}
