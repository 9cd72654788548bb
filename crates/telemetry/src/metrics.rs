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

/// Installs this process's recorder now, if it is not yet: what the
/// libraries record through the `metrics` facade before it exists is lost.
/// A service does so at start ([`describe`]); a test reading a library's
/// metrics calls this first.
pub fn install() {
    handle();
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

/// What a metric is, for its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A latency histogram, in seconds.
    Histogram,
}

/// One metric's `# HELP`, declared by the crate or service that records it
/// (each has a `METRICS` list) and registered with [`describe`].
#[derive(Debug, Clone, Copy)]
pub struct Description {
    /// The metric's name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// The help text.
    pub help: &'static str,
}

impl Description {
    /// A counter.
    pub const fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Counter,
            help,
        }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Gauge,
            help,
        }
    }

    /// A histogram in seconds.
    pub const fn histogram(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Histogram,
            help,
        }
    }
}

/// A `METRICS` list, one line a metric: `kind "name": "help"`, where kind
/// is `counter`, `gauge` or `histogram` (in seconds).
///
/// ```
/// const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
///     counter "jobs_done_total": "Jobs finished.",
///     gauge "jobs_queued": "Jobs waiting.",
/// ];
/// assert_eq!(METRICS[1].name, "jobs_queued");
/// ```
#[macro_export]
macro_rules! descriptions {
    ($($kind:ident $name:literal: $help:literal),* $(,)?) => {
        &[$($crate::metrics::Description::$kind($name, $help)),*]
    };
}

/// Registers the `# HELP` of every metric in `lists` — a service calls it
/// at start with its own list and those of the libraries it runs. Calling
/// it again is harmless.
pub fn describe(lists: &[&[Description]]) {
    handle();
    for d in lists.iter().flat_map(|l| l.iter()) {
        match d.kind {
            Kind::Counter => metrics::describe_counter!(d.name, d.help),
            Kind::Gauge => metrics::describe_gauge!(d.name, d.help),
            Kind::Histogram => metrics::describe_histogram!(d.name, metrics::Unit::Seconds, d.help),
        }
    }
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
        describe(&[&[Description::counter("described_total", "A described counter.")]]);
        incr("described_total", &[]);
        assert!(
            render().contains("# HELP described_total A described counter."),
            "{}",
            render()
        );
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
