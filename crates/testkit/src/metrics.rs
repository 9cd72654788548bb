//! Reading a service's counters from its `/metrics` page.

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

#[cfg(test)]
mod tests {
    use super::*;

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
