//! The consumer's own gauges: lag per partition and dead-letter depth per
//! consumed topic, read from the broker every few seconds.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::Offset;
use tokio_util::sync::CancellationToken;

use crate::group::GroupConsumer;

/// At start and every 5 s until shutdown: `consumer_lag` per partition (high
/// watermark minus the committed offset) and `dead_letter_depth` of each
/// consumed topic's dead-letter topic (librdkafka's blocking calls, on the blocking pool).
pub(crate) async fn observe_lag(
    consumer: Arc<GroupConsumer>,
    name: Arc<str>,
    topics: Vec<String>,
    shutdown: CancellationToken,
) {
    loop {
        // First at start: the gauges (and their alerts) exist from the first second.
        let (c, n, t) = (consumer.clone(), name.clone(), topics.clone());
        let _ = tokio::task::spawn_blocking(move || lag_once(&c, &n, &t)).await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

fn lag_once(consumer: &GroupConsumer, name: &str, topics: &[String]) {
    let timeout = Duration::from_secs(2);
    if let Ok(committed) = consumer.committed(timeout) {
        for p in committed.elements() {
            let Ok((low, high)) = consumer.fetch_watermarks(p.topic(), p.partition(), timeout) else {
                continue;
            };
            let done = match p.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            let partition = p.partition().to_string();
            telemetry::metrics::set(
                "consumer_lag",
                &[("consumer", name), ("topic", p.topic()), ("partition", &partition)],
                (high - done).max(0) as f64,
            );
        }
    }
    for topic in topics {
        let dlq = crate::dead_letter_topic(topic);
        let Ok(metadata) = consumer.fetch_metadata(Some(&dlq), timeout) else {
            continue;
        };
        let depth: i64 = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .filter_map(|p| consumer.fetch_watermarks(&dlq, p.id(), timeout).ok())
            .map(|(low, high)| high - low)
            .sum();
        telemetry::metrics::set("dead_letter_depth", &[("topic", &dlq)], depth as f64);
    }
}
