//! The http-key negative control (`UNSAFE_NO_IDEMPOTENCY_KEY`, test builds
//! only): every request gets a key of its own, so a retry with the client's
//! key is a new request — what the chaos suite's http-key run switches on.
//! Its own binary: a switch is set once per process.

use axum::extract::FromRequest as _;
use idempotency::{FingerprintKey, Idempotent, Refused, Scope};

/// A service's refusal, as small as it gets.
#[derive(Debug)]
struct Refusal;

impl From<Refused> for Refusal {
    fn from(_: Refused) -> Self {
        Refusal
    }
}

impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        axum::http::StatusCode::BAD_REQUEST.into_response()
    }
}

async fn extract(key: &str) -> Idempotent<Refusal> {
    let mut req = axum::http::Request::post("/orders")
        .header("idempotency-key", key)
        .body(axum::body::Body::from("{}"))
        .unwrap();
    req.extensions_mut().insert(Scope("shop".into()));
    Idempotent::from_request(req, &FingerprintKey::for_tests())
        .await
        .unwrap()
}

#[tokio::test]
async fn switched_off_a_retry_with_the_same_key_is_a_new_request() {
    idempotency::negative_controls::turn_off();
    let (first, retry) = (extract("k-1").await, extract("k-1").await);
    assert_ne!(first.key, "k-1", "the client's key is not used");
    assert_ne!(first.key, retry.key, "each delivery a key of its own");
    assert_eq!(first.fingerprint, retry.fingerprint, "the same request");
}
