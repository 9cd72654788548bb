//! Real crashes at named points (failpoints that abort the process), then a
//! restart and the client's retry with the same Idempotency-Key.

use order_api::http::orders;
use std::time::Duration;

use e2e::driver::{Client, OrderRequest, GOOD_CARD};
use e2e::Service;
use sqlx::Connection;

async fn orders_in_db(stack: &e2e::Stack) -> i64 {
    let mut db = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_api_killed_around_its_commit_never_loses_or_duplicates_an_order() {
    let mut stack = crate::stack("crash-api").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    let req = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 700,
        card: GOOD_CARD.into(),
    };

    // 1. Killed after the commit, before the response: the client sees a
    //    broken connection; the retry gets the committed order back, replayed.
    stack.arm(Service::OrderApi, orders::CRASH_AFTER_COMMIT_BEFORE_RESPONSE);
    stack.restart(Service::OrderApi).await.unwrap();
    assert!(
        client.post_order("k-after", &req).await.is_err(),
        "the process died before answering"
    );
    stack
        .wait_exit(Service::OrderApi, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(orders_in_db(&stack).await, 1, "the order committed before the crash");
    stack.disarm(Service::OrderApi);
    stack.start_service(Service::OrderApi).await.unwrap();
    let retry = client.post_order("k-after", &req).await.unwrap();
    assert_eq!((retry.status, retry.replayed), (201, true), "{}", retry.body);
    assert_eq!(orders_in_db(&stack).await, 1);

    // 2. Killed before the commit: nothing was written, the retry executes.
    stack.arm(Service::OrderApi, orders::CRASH_BEFORE_COMMIT);
    stack.restart(Service::OrderApi).await.unwrap();
    assert!(client.post_order("k-before", &req).await.is_err());
    stack
        .wait_exit(Service::OrderApi, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(orders_in_db(&stack).await, 1, "nothing of the killed request survived");
    stack.disarm(Service::OrderApi);
    stack.start_service(Service::OrderApi).await.unwrap();
    let retry = client.post_order("k-before", &req).await.unwrap();
    assert_eq!((retry.status, retry.replayed), (201, false), "{}", retry.body);
    assert_eq!(orders_in_db(&stack).await, 2);

    // Both orders still complete the saga.
    let ids: Vec<uuid::Uuid> = {
        let mut db = sqlx::PgConnection::connect(&stack.db_url("orders")).await.unwrap();
        sqlx::query_scalar("SELECT id FROM orders")
            .fetch_all(&mut db)
            .await
            .unwrap()
    };
    client.seed_stock("WIDGET", 10).await.unwrap();
    let done = client.wait_terminal(&ids, Duration::from_secs(60)).await.unwrap();
    assert!(done
        .values()
        .all(|o| o.status == "CONFIRMED" || o.status == "CANCELLED"));
    stack.shutdown(true).await.unwrap();
}
