//! A deliberately small metrics registry: named counters and gauges with
//! labels, rendered as Prometheus text on each service's `/metrics`.
//!
//! The chaos suite reads these counters (duplicates absorbed, redeliveries,
//! republished rows), so they are plain atomics with no sampling.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

type Key = (String, String);

fn registry() -> &'static Mutex<BTreeMap<Key, Arc<AtomicI64>>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<Key, Arc<AtomicI64>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

static SERVICE: OnceLock<&'static str> = OnceLock::new();

/// Names the service every rendered sample is labelled with (first call wins).
pub fn set_service(service: &'static str) {
    let _ = SERVICE.set(service);
}

fn cell(name: &str, labels: &[(&str, &str)]) -> Arc<AtomicI64> {
    let mut rendered = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            rendered.push(',');
        }
        let _ = write!(rendered, "{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
    }
    let mut map = registry().lock().expect("metrics registry poisoned");
    map.entry((name.to_owned(), rendered)).or_default().clone()
}

/// Adds `by` to the counter `name{labels}`.
pub fn incr_by(name: &str, labels: &[(&str, &str)], by: i64) {
    cell(name, labels).fetch_add(by, Ordering::Relaxed);
}

/// Adds one to the counter `name{labels}`.
pub fn incr(name: &str, labels: &[(&str, &str)]) {
    incr_by(name, labels, 1);
}

/// Sets the gauge `name{labels}` to `value`.
pub fn set(name: &str, labels: &[(&str, &str)], value: i64) {
    cell(name, labels).store(value, Ordering::Relaxed);
}

/// Reads the current value of `name{labels}` (0 when never touched).
pub fn get(name: &str, labels: &[(&str, &str)]) -> i64 {
    cell(name, labels).load(Ordering::Relaxed)
}

/// Renders every metric in the Prometheus text exposition format.
pub fn render() -> String {
    let map = registry().lock().expect("metrics registry poisoned");
    let service = SERVICE.get().copied().unwrap_or("unknown");
    let mut out = String::new();
    for ((name, labels), value) in map.iter() {
        let sep = if labels.is_empty() { "" } else { "," };
        let _ = writeln!(
            out,
            "{name}{{service=\"{service}\"{sep}{labels}}} {}",
            value.load(Ordering::Relaxed)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_cell() {
        incr("t_total", &[("consumer", "a")]);
        incr_by("t_total", &[("consumer", "b")], 4);
        assert_eq!(get("t_total", &[("consumer", "b")]), 4);
        let text = render();
        assert!(text.contains("t_total{service=\"unknown\",consumer=\"a\"} 1"), "{text}");
        assert!(text.contains("t_total{service=\"unknown\",consumer=\"b\"} 4"), "{text}");
    }
}
