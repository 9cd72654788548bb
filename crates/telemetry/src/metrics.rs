//! Metrics through the `metrics` facade, rendered in the Prometheus text
//! format (with `# HELP` and `# TYPE`) by `metrics-exporter-prometheus` on
//! every service's `/metrics`. Every sample carries a `service` label.
//!
//! The recorder is installed on first use, so code outside a service
//! process (tests, the bench) counts too. Histograms are real Prometheus
//! histograms (buckets in seconds), not summaries.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::Label;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static SERVICE: OnceLock<&'static str> = OnceLock::new();
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Upper bounds of every latency histogram, in seconds.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Names the service every sample is labelled with. Call before the first
/// metric (`telemetry::init` does); first call wins.
pub fn set_service(service: &'static str) {
    let _ = SERVICE.set(service);
}

fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .add_global_label("service", SERVICE.get().copied().unwrap_or("unknown"))
            .set_buckets(&BUCKETS)
            .expect("static buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        // A recorder installed by someone else wins; ours then renders nothing.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        // Histogram samples are buffered until drained: drain them even when
        // nobody scrapes.
        let upkeep = handle.clone();
        std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                upkeep.run_upkeep();
            })
            .expect("spawn metrics upkeep thread");
        handle
    })
}

fn labels(labels: &[(&str, &str)]) -> Vec<Label> {
    labels
        .iter()
        .map(|(k, v)| Label::new((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Adds `by` to the counter `name{labels}`.
pub fn incr_by(name: &'static str, labels_: &[(&str, &str)], by: u64) {
    handle();
    metrics::counter!(name, labels(labels_)).increment(by);
}

/// Adds one to the counter `name{labels}`.
pub fn incr(name: &'static str, labels_: &[(&str, &str)]) {
    incr_by(name, labels_, 1);
}

/// Sets the gauge `name{labels}` to `value`.
pub fn set(name: &'static str, labels_: &[(&str, &str)], value: f64) {
    handle();
    metrics::gauge!(name, labels(labels_)).set(value);
}

/// Records one observation of `elapsed` in the histogram `name{labels}` (seconds).
pub fn observe(name: &'static str, labels_: &[(&str, &str)], elapsed: Duration) {
    handle();
    metrics::histogram!(name, labels(labels_)).record(elapsed.as_secs_f64());
}

/// The current value of counter or gauge `name{labels}` in this process
/// (0 when never touched), read from the rendered exposition.
pub fn get(name: &str, labels: &[(&str, &str)]) -> f64 {
    sum_samples(&render(), name, labels)
}

/// Sums every sample of `name` in a Prometheus text page whose labels
/// contain all of `filter` (comments and other metrics are skipped).
pub fn sum_samples(text: &str, name: &str, filter: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (head, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match head.split_once('{') {
                Some((m, l)) => (m, l.trim_end_matches('}')),
                None => (head, ""),
            };
            if metric != name {
                return None;
            }
            let labels: Vec<(&str, &str)> = labels
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
                .collect();
            let all = filter.iter().all(|f| labels.contains(f));
            all.then(|| value.trim().parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// Every metric in the Prometheus text exposition format.
pub fn render() -> String {
    handle().render()
}

/// `# HELP` for every metric this system records.
fn describe() {
    use metrics::{describe_counter as c, describe_gauge as g, describe_histogram as h, Unit};
    c!(
        "orders_created_total",
        "Orders created by POST /orders (replays not counted)."
    );
    c!(
        "http_idempotent_replays_total",
        "Requests answered from a stored Idempotency-Key response."
    );
    c!(
        "http_idempotent_in_flight_total",
        "Requests refused because the same key was still being processed."
    );
    h!(
        "http_server_request_duration_seconds",
        Unit::Seconds,
        "HTTP request latency by route and status."
    );
    c!(
        "consumer_messages_received_total",
        "Messages a consumer took from the broker."
    );
    c!(
        "consumer_batches_total",
        "Handler calls (a batch of one partition's queued messages each)."
    );
    c!(
        "consumer_events_applied_total",
        "Events whose effect was applied (inbox row written with it)."
    );
    c!(
        "consumer_duplicates_absorbed_total",
        "Redelivered events the inbox turned into no-ops."
    );
    c!("consumer_transient_errors_total", "Handler failures retried in place.");
    c!(
        "consumer_dead_lettered_total",
        "Messages moved to the dead-letter topic."
    );
    h!(
        "consumer_handler_duration_seconds",
        Unit::Seconds,
        "Handler latency per call (one batch, one transaction)."
    );
    g!(
        "consumer_lag",
        "Messages behind: partition high watermark minus committed offset."
    );
    c!(
        "consumer_rebalances_total",
        "Group rebalances this member took part in, by kind (assign, revoke)."
    );
    g!(
        "consumer_partitions_assigned",
        "1 for each partition the group assigned to this member, 0 once revoked."
    );
    g!("dead_letter_depth", "Messages in a consumed topic's dead-letter topic.");
    c!("relay_published_total", "Outbox rows published and marked.");
    c!(
        "relay_publish_errors_total",
        "Publish attempts that failed (row stays pending)."
    );
    c!(
        "relay_parked_total",
        "Rows the broker refused for good (parked, not retried)."
    );
    c!(
        "relay_republished_after_crash_total",
        "Rows published again because a crash lost their mark."
    );
    h!(
        "relay_publish_duration_seconds",
        Unit::Seconds,
        "From sending a claimed batch to the broker's last ack."
    );
    g!("relay_pending_rows", "Outbox rows not yet published.");
    g!(
        "outbox_oldest_pending_seconds",
        "Age of the oldest unpublished outbox row."
    );
    c!("saga_transitions_total", "Saga state changes, by from and to.");
    c!(
        "saga_ignored_transitions_total",
        "Replies not legal in the order's state (stale, reordered, repeated)."
    );
    c!(
        "saga_unknown_order_total",
        "Replies for an order id this service never created."
    );
    h!(
        "saga_duration_seconds",
        Unit::Seconds,
        "Placed to terminal (CONFIRMED or CANCELLED), by final status."
    );
    c!("inventory_reserved_total", "Reservations made.");
    c!(
        "inventory_rejected_total",
        "Reservations refused (out of stock, invalid)."
    );
    c!("inventory_released_total", "Reservations released.");
    c!(
        "inventory_repeat_commands_total",
        "Commands for an order already reserved/released (no-ops)."
    );
    c!("payment_settled_total", "Charges and refunds settled with the gateway.");
    c!(
        "payment_repeat_commands_total",
        "Payment commands already settled (no-ops)."
    );
    c!("gateway_charges_total", "Charges the mock gateway executed.");
    c!("gateway_refunds_total", "Refunds the mock gateway executed.");
    c!(
        "gateway_injected_faults_total",
        "Faults the mock gateway injected on purpose."
    );
    c!(
        "gateway_tokens_issued_total",
        "Card tokens the vault answered (new or existing)."
    );
    c!(
        "gateway_operation_lookups_total",
        "Reconciliation lookups of an operation by its key, by whether one was found."
    );
    c!(
        "saga_deadline_actions_total",
        "What the deadline scan did to an overdue order: reconciled, resent, manual_review or skipped."
    );
    c!(
        "saga_replies_after_reconciliation_total",
        "Participant replies that arrived after reconciliation had taken the gateway's answer (set aside)."
    );
    g!("orders_manual_review", "Orders in MANUAL_REVIEW, waiting for a person.");
    c!(
        "payment_reconciliations_total",
        "Overdue PENDING operations looked up at the gateway, by result (settled, absent, skipped)."
    );
    g!(
        "payments_pending",
        "Payment operations PENDING (the gateway's answer not recorded yet)."
    );
    g!(
        "payments_oldest_pending_seconds",
        "Age of the oldest PENDING payment operation (0 when none)."
    );
    c!(
        "api_refusals_total",
        "Requests refused before a handler: unauthenticated, lookup_limited, too_large or rate_limited."
    );
    c!(
        "api_key_lookups_total",
        "API-key lookups that reached the database (a key neither cached nor known bad)."
    );
    c!(
        "api_key_lookups_avoided_total",
        "API-key lookups skipped: a key known not to exist, or the caller's address over its lookup limit."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_help_type_and_labels() {
        incr("t_total", &[("consumer", "a")]);
        incr_by("t_total", &[("consumer", "b")], 4);
        observe("t_seconds", &[], Duration::from_millis(3));
        assert_eq!(get("t_total", &[("consumer", "b")]), 4.0);
        assert_eq!(get("t_total", &[]), 5.0);
        let text = render();
        assert!(text.contains("# TYPE t_total counter"), "{text}");
        assert!(
            text.contains("t_total{service=\"unknown\",consumer=\"a\"} 1")
                || text.contains("t_total{consumer=\"a\",service=\"unknown\"} 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE t_seconds histogram"), "{text}");
        assert!(text.contains("t_seconds_bucket{"), "{text}");
        incr("orders_created_total", &[]);
        assert!(render().contains("# HELP orders_created_total"), "{}", render());
    }

    #[test]
    fn sums_matching_samples_by_exact_label() {
        let text = "# HELP t_total things\n# TYPE t_total counter\n\
                    t_total{service=\"x\",consumer=\"a\"} 1\n\
                    t_total{service=\"x\",consumer=\"ab\"} 4\n\
                    other 9\nplain_total 2\n";
        assert_eq!(sum_samples(text, "t_total", &[]), 5.0);
        assert_eq!(sum_samples(text, "t_total", &[("consumer", "a")]), 1.0);
        assert_eq!(sum_samples(text, "plain_total", &[]), 2.0);
        assert_eq!(sum_samples(text, "missing", &[]), 0.0);
    }
}
