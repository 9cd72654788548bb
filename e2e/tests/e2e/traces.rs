//! One order, one trace: every service exports its spans over OTLP to a
//! receiver inside this test, and the parent chain from `POST /orders` to
//! the step that made the order CONFIRMED is unbroken — through the relay,
//! inventory, the order saga, payment-service, and (on a branch) the gateway
//! call and the gateway's own server span.
//!
//! The public port does not let a client choose that trace: the client's
//! `traceparent` is a link of the `POST /orders` span, which roots a trace
//! of its own (`service_kit::http::trace_public`). Checked to fail with the
//! caller's context followed instead (`Supervisor::serve` for order-api's
//! port): the order's spans then sit in the caller's trace.
//!
//! Checked to fail when a hop drops the context: with the consumer's
//! `telemetry::propagation::follow` removed from `kafka::consumer`, each
//! consumer starts a new trace and the test names the span whose parent is
//! missing.

use std::time::{Duration, Instant};

use e2e::driver::{new_key, Client, OrderRequest};
use e2e::otlp::{Receiver, Span, Trace};
use e2e::stack::Service;

const SERVICES: [Service; 5] = [
    Service::Gateway,
    Service::Inventory,
    Service::Payment,
    Service::OrderApi,
    Service::Relay,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_is_one_trace_across_all_five_services() {
    let receiver = Receiver::start().await.unwrap();
    let share = crate::share().await;
    let mut opts = e2e::StackOptions::ephemeral("traces").unwrap();
    for s in SERVICES {
        opts.extra_env
            .push((s, "OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.endpoint()));
        opts.extra_env.push((s, "OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
        // The per-order lines are DEBUG (telemetry::trace::PER_ORDER): in
        // the spans always, in the log when the filter asks, as here.
        opts.extra_env.push((
            s,
            "RUST_LOG".into(),
            format!("info,{}=debug", telemetry::trace::PER_ORDER),
        ));
    }
    let stack = e2e::Stack::start(opts).await.expect("stack starts");
    let client = Client::new(&stack, Duration::from_secs(10)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();

    // The caller's own trace: the API links it and starts its own.
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let caller_span = "00f067aa0ba902b7";
    let response = reqwest::Client::new()
        .post(format!("{}/orders", stack.url(Service::OrderApi)))
        .header("idempotency-key", new_key())
        .bearer_auth(stack.api_key())
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&OrderRequest {
            sku: "WIDGET".into(),
            quantity: 1,
            amount_cents: 1_250,
            card: e2e::driver::GOOD_CARD.into(),
        })
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let order: e2e::driver::OrderView = response.json().await.unwrap();
    assert_eq!(
        client.final_status(order.id, Duration::from_secs(30)).await.unwrap(),
        "CONFIRMED"
    );

    // Spans arrive in batches every 100 ms; wait for the confirming step and
    // for spans from every service.
    let deadline = Instant::now() + Duration::from_secs(20);
    let linked = (trace_id.clone(), caller_span.to_owned());
    let (own, trace) = loop {
        let root = receiver
            .spans()
            .into_iter()
            .find(|s| s.name == "POST /orders" && s.links.contains(&linked));
        let own = root.as_ref().map_or_else(String::new, |s| s.trace_id.clone());
        let trace = receiver.trace(&own);
        let confirmed = trace.with_event("saga transition", "to", "CONFIRMED").is_some();
        if confirmed && trace.services().len() == 5 && chain(&trace, "").is_ok() {
            break (own, trace);
        }
        if Instant::now() > deadline {
            break (own, trace);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!own.is_empty(), "a POST /orders span linked to the caller's context");
    assert_ne!(own, trace_id, "the order's trace is its own, not the caller's");
    assert!(
        receiver.trace(&trace_id).spans.is_empty(),
        "no span of ours in the caller's trace"
    );
    // Log lines carry the trace too: one grep finds the order everywhere.
    let logged: Vec<&str> = SERVICES
        .iter()
        .filter(|s| {
            std::fs::read_to_string(stack.log_path(**s))
                .unwrap_or_default()
                .contains(&format!("trace_id={own}"))
        })
        .map(|s| s.name())
        .collect();
    let svg = trace.svg(&format!("order {} — trace {own}", order.id));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/traces");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("one-order.svg"), &svg).unwrap();
    stack.shutdown(true).await.unwrap();
    drop(share);

    assert_eq!(
        trace.services().into_iter().collect::<Vec<_>>(),
        vec![
            "inventory-service",
            "mock-gateway",
            "order-api",
            "outbox-relay",
            "payment-service"
        ],
        "spans from all five services in the order's trace"
    );
    let path = chain(&trace, "").unwrap_or_else(|e| panic!("{e}"));
    let hops: Vec<&str> = path.iter().map(|s| s.service.as_str()).fold(Vec::new(), |mut v, s| {
        if v.last() != Some(&s) {
            v.push(s);
        }
        v
    });
    assert_eq!(
        hops,
        vec![
            "order-api",         // POST /orders, the order and its ReserveStock in the outbox
            "outbox-relay",      // publish ReserveStock
            "inventory-service", // reserve, StockReserved in the outbox
            "outbox-relay",      // publish StockReserved
            "order-api",         // saga step: ChargePayment in the outbox
            "outbox-relay",      // publish ChargePayment
            "payment-service",   // charge, PaymentCharged in the outbox
            "outbox-relay",      // publish PaymentCharged
            "order-api",         // saga step: CONFIRMED
        ],
        "the parent chain, root first: {:#?}",
        path.iter().map(|s| (&s.service, &s.name)).collect::<Vec<_>>()
    );
    assert_eq!(path[0].name, "POST /orders");
    assert!(
        logged.contains(&"order-api") && logged.contains(&"payment-service"),
        "log lines name the trace id: found in {logged:?}"
    );
    // The gateway branch: its server span descends from payment-service's call.
    let gateway = trace
        .spans
        .iter()
        .find(|s| s.service == "mock-gateway" && s.name == "POST /v1/charges")
        .expect("the gateway's server span");
    let above = trace.ancestry(gateway, "").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        above
            .iter()
            .any(|s| s.service == "payment-service" && s.name == "POST /v1/charges"),
        "the gateway call is the parent of the gateway's span: {:#?}",
        above.iter().map(|s| (&s.service, &s.name)).collect::<Vec<_>>()
    );
    assert!(svg.matches("<rect").count() >= trace.spans.len(), "one bar per span");
}

/// The confirming step's ancestry, root first, up to the span whose parent
/// is `root_parent` ("" for the trace's root).
fn chain<'a>(trace: &'a Trace, root_parent: &str) -> Result<Vec<&'a Span>, String> {
    let leaf = trace
        .with_event("saga transition", "to", "CONFIRMED")
        .ok_or("no span recorded the CONFIRMED transition")?;
    let mut path = trace.ancestry(leaf, root_parent)?;
    path.reverse();
    Ok(path)
}
