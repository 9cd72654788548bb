//! Every HTTP API fuzzed from its own OpenAPI document with schemathesis —
//! order-api, the gateway and inventory's stock endpoints, each with its
//! credential: every phase (examples, coverage, fuzzing, stateful), every
//! check — no 5xx, responses that match the schema, only documented status
//! codes and content types — on one running stack, ≥ 1,000 requests each.
//!
//! One check is left out: `positive_data_acceptance` expects every
//! schema-valid request to succeed, and here some must not: a valid body
//! under an Idempotency-Key already used with another body is a 422, a
//! valid cancel of an order that is not CONFIRMED is a 409, a charge of a
//! token the vault never issued is a 422 — all documented. Requests carry
//! the service's credential; `ignored_auth` (in "all") checks that the same
//! requests without it are refused.

use std::process::Command;

use e2e::stack::Service;

/// Runs schemathesis over `service`'s committed document with `credential`,
/// up to `examples` per operation and phase; returns the failure report, or
/// the number of requests generated.
async fn fuzz(
    stack: &e2e::Stack,
    service: Service,
    document: &str,
    credential: &str,
    examples: u32,
) -> Result<usize, String> {
    match fuzz_once(stack, service, document, credential, examples).await {
        // A lone transport error and no failed check: run once more. Seen
        // twice in ~2,600 requests on the gateway's https port (schemathesis:
        // "SSL … EOF occurred in violation of protocol" on one POST of the
        // coverage phase, none in a run on the same seed before or after):
        // the likeliest cause is a request whose body arrived after its
        // early refusal, closed with unread data (hyper has no lingering
        // close), not a response of the service. Any failed check, any
        // other error, or the same again fails the test.
        Err(report) if transport_only(&report) => {
            eprintln!("fuzz: {document}: a lone network error, run again:\n{report}");
            fuzz_once(stack, service, document, credential, examples).await
        }
        other => other,
    }
}

/// Whether schemathesis's report holds network errors and nothing else:
/// no check failed ("N generated, N passed, K errored").
fn transport_only(report: &str) -> bool {
    let cases = report.lines().find(|l| l.contains(" generated,")).unwrap_or_default();
    report.contains("Network Error") && cases.contains(" errored") && !cases.contains(" failed")
}

async fn fuzz_once(
    stack: &e2e::Stack,
    service: Service,
    document: &str,
    credential: &str,
    examples: u32,
) -> Result<usize, String> {
    let st = testkit::schemathesis::ensure().expect("schemathesis available");
    let schema = format!("{}/../docs/openapi/{document}.json", env!("CARGO_MANIFEST_DIR"));
    let url = stack.url(service);
    let auth = format!("Authorization: Bearer {credential}");
    let ca = stack.ca_file().display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(st)
            .args(["run", &schema, "--url", &url, "--checks", "all"])
            .args(["--tls-verify", &ca])
            .args(["--header", &auth])
            .args(["--exclude-checks", "positive_data_acceptance"])
            .args(["--max-examples", &examples.to_string()])
            .args(["--seed", "20261130", "--no-color"])
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
    if !out.status.success() {
        return Err(format!("schemathesis found problems with {document}:\n{text}"));
    }
    // The summary: "1579 generated, 1579 passed, 6 skipped".
    let generated: usize = text
        .lines()
        .find_map(|l| l.trim().split_once(" generated,")?.0.trim().parse().ok())
        .unwrap_or(0);
    if generated < 1_000 {
        return Err(format!("{document}: only {generated} requests generated:\n{text}"));
    }
    println!("fuzz: {document}: {generated} requests, 0 failures");
    Ok(generated)
}

#[test]
fn only_a_report_of_network_errors_alone_is_run_again() {
    let errored = "Errors:\n  🚫 Network Error: 1\nTest cases:\n  2599 generated, 2599 passed, 1 errored, 2 skipped";
    assert!(transport_only(errored));
    let failed = "Failures:\n  ❌ Server error: 1\nErrors:\n  🚫 Network Error: 1\nTest cases:\n  2599 generated, 2598 passed, 1 failed, 1 errored";
    assert!(!transport_only(failed));
    let other = "Errors:\n  🚫 Schema error: 1\nTest cases:\n  10 generated, 10 passed, 1 errored";
    assert!(!transport_only(other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_wrong_with_any_http_api() {
    let stack = crate::stack("fuzz").await;
    let secrets = stack.secrets().clone();
    // Examples per operation: inventory has two operations, the others
    // several, so it needs more of each to reach 1,000 requests.
    // The gateway once per caller: each may use only its own routes
    // (GATEWAY_GRANTS), and is refused the other's with a documented 403.
    let runs = [
        (Service::OrderApi, "order-api", stack.api_key().to_owned(), 400),
        (Service::Gateway, "mock-gateway", secrets.payment_gateway.clone(), 400),
        (Service::Gateway, "mock-gateway", secrets.order_api_gateway.clone(), 200),
        (Service::Inventory, "inventory-service", secrets.operator.clone(), 1_000),
    ];
    let mut failures = Vec::new();
    for (service, document, credential, examples) in runs {
        if let Err(report) = fuzz(&stack, service, document, &credential, examples).await {
            // What the service logged about it: a 500's cause is in its log.
            let log = std::fs::read_to_string(stack.log_path(service)).unwrap_or_default();
            let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).take(20).collect();
            failures.push(format!("{report}\n{} logged:\n{}", service.name(), errors.join("\n")));
        }
    }
    stack.shutdown(true).await.unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
