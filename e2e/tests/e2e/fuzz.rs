//! order-api fuzzed from its own OpenAPI document with schemathesis: every
//! phase (examples, coverage, fuzzing, stateful), every check — no 5xx,
//! responses that match the schema, only documented status codes and
//! content types — on a running stack.
//!
//! One check is left out: `positive_data_acceptance` expects every
//! schema-valid request to succeed, and here some must not: a valid body
//! under an Idempotency-Key already used with another body is a 422, and a
//! valid cancel of an order that is not CONFIRMED is a 409 — both documented.
//! Requests carry the stack's API key; `ignored_auth` (in "all") checks that
//! the same requests without it are refused.

use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_wrong_with_order_api() {
    let st = testkit::schemathesis::ensure().expect("schemathesis available");
    let stack = crate::stack("fuzz").await;
    let schema = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi/order-api.json");
    let url = stack.url(e2e::stack::Service::OrderApi);
    let auth = format!("Authorization: Bearer {}", stack.api_key());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(st)
            .args(["run", schema, "--url", &url, "--checks", "all"])
            .args(["--header", &auth])
            .args(["--exclude-checks", "positive_data_acceptance"])
            .args(["--max-examples", "400", "--seed", "20261130", "--no-color"])
            .output()
    })
    .await
    .unwrap()
    .expect("st runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    stack.shutdown(true).await.unwrap();
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    // The summary: "1579 generated, 1579 passed, 6 skipped".
    let generated: usize = text
        .lines()
        .find_map(|l| l.trim().split_once(" generated,")?.0.trim().parse().ok())
        .unwrap_or(0);
    assert!(generated >= 1_000, "only {generated} requests generated:\n{text}");
}
