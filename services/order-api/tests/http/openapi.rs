//! The OpenAPI document: generated from the code, served, committed, current.

use std::time::Duration;

use crate::TestApi;

#[tokio::test]
async fn the_served_openapi_document_is_the_committed_one() {
    let generated = order_api::http::openapi_json();
    testkit::openapi::check_committed(
        "order-api",
        &generated,
        &["/orders", "/orders/{id}", "/orders/{id}/cancel"],
        &[],
    );
    let api = TestApi::start(Duration::from_secs(60)).await;
    let served = api.http.get(api.url("/openapi.json")).send().await.unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.text().await.unwrap(), generated);
    api.stop().await;
}
