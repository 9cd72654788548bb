//! The OpenAPI document: generated from the code, served, committed, current.

use std::time::Duration;

use crate::TestApi;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi/order-api.json");

#[tokio::test]
async fn the_served_openapi_document_is_the_committed_one() {
    let generated = order_api::http::openapi_json();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::create_dir_all(std::path::Path::new(COMMITTED).parent().unwrap()).unwrap();
        std::fs::write(COMMITTED, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi/order-api.json is stale: run `UPDATE_OPENAPI=1 cargo test -p order-api --test http openapi` and commit it"
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "OpenAPI 3.1");
    for path in ["/orders", "/orders/{id}", "/orders/{id}/cancel"] {
        assert!(doc["paths"][path].is_object(), "{path} documented");
    }
    // Every error response is problem+json.
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            for (status, resp) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert!(
                        resp["content"]["application/problem+json"].is_object(),
                        "{method} {path} {status} is not problem+json"
                    );
                }
            }
        }
    }
    let api = TestApi::start(Duration::from_secs(60)).await;
    let served = api.http.get(api.url("/openapi.json")).send().await.unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.text().await.unwrap(), generated);
    api.stop().await;
}
