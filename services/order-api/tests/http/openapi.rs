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
    let served = api
        .http
        .get(format!("http://{}/openapi.json", api.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.text().await.unwrap(), generated);
    // The admin endpoints answer on the admin port only: the public one has
    // nothing at their paths, with or without a key.
    let key = api.key("test-client").await;
    for path in ["/openapi.json", "/metrics", "/health/ready", "/health/live"] {
        let public = api.http.get(api.url(path)).bearer_auth(&key).send().await.unwrap();
        assert_eq!(public.status(), 404, "{path} on the public port");
        let admin = api
            .http
            .get(format!("http://{}{path}", api.admin))
            .send()
            .await
            .unwrap();
        // Ready or not yet (the consumer may still be joining), but answered.
        assert_ne!(admin.status(), 404, "{path} on the admin port");
    }
    api.stop().await;
}
