//! The services' pool settings against a real PostgreSQL: a connection used
//! within `PING_IF_IDLE_FOR` is handed out without a round trip of its own,
//! one idle for longer is pinged first and, dead, replaced.

use std::time::Duration;

use service_kit::db::PING_IF_IDLE_FOR;
use sqlx::{Connection as _, PgConnection, PgPool};

async fn backend_pid(pool: &PgPool) -> sqlx::Result<i32> {
    sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(pool).await
}

/// Terminates backend `pid` from a connection of its own and waits until it is gone.
async fn kill(url: &str, pid: i32) {
    let mut admin = PgConnection::connect(url).await.unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(killed, "backend {pid} terminated");
    for _ in 0..50 {
        let alive: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        if !alive {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} still there");
}

#[tokio::test]
async fn a_recently_used_connection_is_not_pinged_and_an_idle_one_is_pinged_and_replaced() {
    let url = format!("{}/postgres", testkit::db::server_url());
    let pool = service_kit::db::pool(&url, 1).await.unwrap();

    // Used a moment ago, then killed: handed out as it is, without a ping,
    // so its statement is the one that finds it dead.
    let first = backend_pid(&pool).await.unwrap();
    kill(&url, first).await;
    let used_dead = backend_pid(&pool).await;
    assert!(
        used_dead.is_err(),
        "a connection used within {PING_IF_IDLE_FOR:?} goes out unpinged, so the dead one fails its statement; got {used_dead:?}"
    );
    // The broken connection is not handed out again.
    let second = backend_pid(&pool).await.expect("a fresh connection");
    assert_ne!(second, first);

    // Idle past the window, then killed: pinged first, found dead, replaced
    // — the caller never sees it.
    kill(&url, second).await;
    tokio::time::sleep(PING_IF_IDLE_FOR + Duration::from_millis(200)).await;
    let third = backend_pid(&pool)
        .await
        .expect("the idle dead connection was pinged and replaced");
    assert_ne!(third, second);
}
