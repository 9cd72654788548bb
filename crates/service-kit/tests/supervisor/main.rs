//! The supervisor with the real admin router and a real PostgreSQL:
//! readiness is "database answers and every task alive", and a dead task
//! turns it off and fails the service.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use service_kit::Supervisor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

async fn ready(router: &Router) -> (StatusCode, String) {
    let resp = router
        .clone()
        .oneshot(Request::get("/health/ready").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_dead_consumer_turns_the_service_not_ready_and_fails_it() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{}/postgres", testkit::db::server_url()))
        .await
        .unwrap();
    let mut tasks = Supervisor::new(CancellationToken::new());
    let (kill, killed) = tokio::sync::oneshot::channel::<()>();
    tasks.spawn("saga consumer", async move {
        let _ = killed.await;
        Err::<(), _>(anyhow::anyhow!("broker session lost"))
    });
    let token = tasks.token();
    let reaper_stopped = tokio::spawn(async move { token.cancelled().await });
    let router = service_kit::admin::router(&pool, tasks.health());
    assert_eq!(ready(&router).await.0, StatusCode::OK, "alive and the database answers");

    let supervised = tokio::spawn(tasks.wait());
    kill.send(()).unwrap();
    let err = supervised.await.unwrap().expect_err("the service fails");
    assert!(format!("{err:#}").contains("saga consumer"), "{err:#}");
    let (status, why) = ready(&router).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        why.contains("saga consumer") && why.contains("broker session lost"),
        "{why}"
    );
    reaper_stopped.await.expect("the other tasks were told to stop");
}

/// Every connection of the service's pool busy (a backlog of requests) is
/// load, not a database that stopped answering: readiness asks on its own
/// connection and stays ready.
#[tokio::test]
async fn a_pool_busy_with_requests_leaves_the_service_ready() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(&format!("{}/postgres", testkit::db::server_url()))
        .await
        .unwrap();
    let tasks = Supervisor::new(CancellationToken::new());
    let router = service_kit::admin::router(&pool, tasks.health());
    let held = pool.acquire().await.unwrap();
    assert_eq!(
        ready(&router).await,
        (StatusCode::OK, "ready".to_owned()),
        "the pool's only connection held by a request"
    );
    drop(held);
    tasks.token().cancel();
}
