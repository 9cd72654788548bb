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
        &[
            "gateway_charges_total",
            "gateway_tokens_issued_total",
            "http_server_request_duration_seconds_count",
        ],
    ),
    (
        Service::Relay,
        &["relay_published_total", "relay_publish_duration_seconds_count"],
    ),
];

/// Gauges that must be present (they may be 0): each one an alert of
/// docker/alerts.yml reads.
const PRESENT: [(Service, &str); 6] = [
    (Service::OrderApi, "consumer_lag"),
    (Service::OrderApi, "orders_manual_review"),
    (Service::Inventory, "consumer_lag"),
    (Service::Payment, "dead_letter_depth"),
    (Service::Payment, "payments_oldest_pending_seconds"),
    (Service::Relay, "outbox_oldest_pending_seconds"),
];

/// Every metric a service, a consumer or a reusable crate describes.
pub fn described() -> std::collections::BTreeSet<&'static str> {
    [
        order_api::METRICS,
        inventory_service::METRICS,
        payment_service::METRICS,
        mock_gateway::METRICS,
        kafka::METRICS,
        saga_kit::METRICS,
        service_kit::http::METRICS,
        gateway_client::METRICS,
        outbox_relay::guard::METRICS,
    ]
    .iter()
    .flat_map(|list| list.iter().map(|d| d.name))
    // The reusable crates list theirs by kind, for the `metrics` facade.
    .chain(
        [
            outbox::COUNTERS,
            outbox::GAUGES,
            outbox::HISTOGRAMS,
            idempotency::COUNTERS,
        ]
        .iter()
        .flat_map(|list| list.iter().map(|(name, _)| *name)),
    )
    .collect()
}

/// The metric names a PromQL expression reads: label names (in `by (…)`
/// groupings and `{…}` matchers), ranges (`[…]`) and functions left out; a
/// histogram's `_bucket` / `_count` / `_sum` series named by its metric.
pub fn metrics_read(expr: &str) -> Vec<String> {
    const FUNCTIONS: [&str; 1] = ["histogram_quantile"];
    let mut bare = expr.to_owned();
    for (open, close) in [("by (", ')'), ("{", '}'), ("[", ']')] {
        while let Some(at) = bare.find(open) {
            let end = bare[at..].find(close).map_or(bare.len(), |e| at + e + 1);
            bare.replace_range(at..end, " ");
        }
    }
    bare.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.contains('_') && w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .filter(|w| !FUNCTIONS.contains(w))
        .map(|w| {
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| w.strip_suffix(s))
                .unwrap_or(w)
                .to_owned()
        })
        .collect()
}

/// Every alert fires from series made for it, and none on a calm system:
/// docker/alerts.test.yml under `promtool test rules`; an alert of
/// alerts.yml without a firing case there fails this test. Checked against
/// the removals: an expected summary changed, and InboxMisses' rule
/// deleted — each failed.
#[test]
fn every_alert_fires_from_its_series_and_none_on_a_calm_system() {
    let promtool = testkit::promtool::ensure().expect("promtool available");
    let docker = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker");
    let (ok, report) = testkit::promtool::test_rules(&promtool, &docker.join("alerts.test.yml")).unwrap();
    assert!(ok, "promtool test rules:\n{report}");
    let rules = std::fs::read_to_string(docker.join("alerts.yml")).unwrap();
    let cases = std::fs::read_to_string(docker.join("alerts.test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 11, "{alerts:?}");
    for alert in alerts {
        assert!(
            cases.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - exp_labels"
            )),
            "{alert} has no case in docker/alerts.test.yml that fires it"
        );
    }
}

/// docker/alerts.yml is valid for Prometheus (`promtool check rules`), and
/// every metric its expressions read is one the services describe (a
/// crate's or a service's `METRICS`).
#[test]
fn the_alert_rules_are_valid_and_read_metrics_that_exist() {
    let promtool = testkit::promtool::ensure().expect("promtool available");
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker/alerts.yml");
    let (ok, report) = testkit::promtool::check_rules(&promtool, &rules).unwrap();
    assert!(ok, "promtool check rules:\n{report}");
    assert!(report.contains("12 rules found"), "{report}");
    let described = described();
    let text = std::fs::read_to_string(&rules).unwrap();
    for expr in text.lines().filter_map(|l| l.trim().strip_prefix("expr: ")) {
        for name in metrics_read(expr) {
            assert!(described.contains(name.as_str()), "{expr}: {name} is not a metric");
        }
    }
}

pub async fn check_pages(stack: &Stack) {
    let promtool = testkit::promtool::ensure().expect("promtool available");
    // Lag and dead-letter gauges refresh every 5 s.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let http = reqwest::Client::new();
    for (service, moved) in MOVED {
        let page = http
            .get(format!("{}/metrics", stack.admin_url(service)))
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
