//! Every service's `/metrics` after a run: valid for Prometheus (`promtool
//! check metrics`: HELP, TYPE, names, histogram shape) and the key series
//! moved. Called by the saga test on its stack after the demo, so the
//! counters have something to count.

use e2e::stack::{Service, Stack};
use telemetry::metrics::sum_samples;

/// (service, series that must be > 0 after a demo run)
const MOVED: [(Service, &[&str]); 5] = [
    (
        Service::OrderApi,
        &[
            "orders_created_total",
            "consumer_events_applied_total",
            "saga_transitions_total",
            "http_server_request_duration_seconds_count",
            "saga_duration_seconds_count",
            "consumer_handler_duration_seconds_count",
        ],
    ),
    (
        Service::Inventory,
        &[
            "consumer_events_applied_total",
            "inventory_reserved_total",
            "consumer_batches_total",
        ],
    ),
    (
        Service::Payment,
        &["consumer_events_applied_total", "payment_settled_total"],
    ),
    (
        Service::Gateway,
        &["gateway_charges_total", "http_server_request_duration_seconds_count"],
    ),
    (
        Service::Relay,
        &["relay_published_total", "relay_publish_duration_seconds_count"],
    ),
];

/// Gauges that must be present (they may be 0).
const PRESENT: [(Service, &str); 4] = [
    (Service::OrderApi, "consumer_lag"),
    (Service::Inventory, "consumer_lag"),
    (Service::Payment, "dead_letter_depth"),
    (Service::Relay, "outbox_oldest_pending_seconds"),
];

pub async fn check_pages(stack: &Stack) {
    let promtool = testkit::promtool::ensure().expect("promtool available");
    // Lag and dead-letter gauges refresh every 5 s.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let http = reqwest::Client::new();
    for (service, moved) in MOVED {
        let page = http
            .get(format!("{}/metrics", stack.url(service)))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let problems = testkit::promtool::check_metrics(&promtool, &page).unwrap();
        assert!(
            problems.is_empty(),
            "{}: promtool check metrics:\n{problems}",
            service.name()
        );
        assert!(page.contains("# HELP "), "{}: no HELP lines", service.name());
        for series in moved {
            assert!(
                sum_samples(&page, series, &[]) > 0.0,
                "{}: {series} did not move:\n{page}",
                service.name()
            );
        }
        for (s, gauge) in PRESENT {
            if s == service {
                assert!(
                    page.lines().any(|l| l.starts_with(&format!("{gauge}{{"))),
                    "{}: gauge {gauge} missing:\n{page}",
                    service.name()
                );
            }
        }
    }
}
