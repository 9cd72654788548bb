//! What a test reads from a running stack: metrics pages, crash-point
//! reports in the logs, and the database connections it can drop.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Service, Stack};

impl Stack {
    /// Terminates every PostgreSQL backend connected to this stack's
    /// databases (`pg_terminate_backend`); returns how many.
    pub async fn terminate_db_connections(&self) -> anyhow::Result<i64> {
        use sqlx::Connection;
        let mut admin = sqlx::PgConnection::connect(&format!("{}/postgres", self.opts.pg_base)).await?;
        let names: Vec<String> = ["orders", "inventory", "payments", "gateway"]
            .map(|d| self.db_url(d).rsplit('/').next().unwrap_or_default().to_owned())
            .to_vec();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = ANY($1) AND pid <> pg_backend_pid()",
        )
        .bind(&names)
        .fetch_one(&mut admin)
        .await?;
        Ok(n)
    }

    /// How many times `s` reported crash point `point` firing in its own
    /// output (`telemetry::crash_point` prints it just before aborting).
    pub fn crash_point_reports(&self, s: Service, point: &str) -> usize {
        let line = format!("{} {point}", telemetry::CRASH_POINT_FIRED);
        std::fs::read_to_string(self.log_path(s))
            .map(|log| log.lines().filter(|l| l.contains(&line)).count())
            .unwrap_or(0)
    }

    /// Each of the saga's consumer groups' lag on its topic, in the order
    /// of `contract::topics::consumers::ALL` (`None`: not read).
    pub async fn groups_lag(&self) -> Vec<Option<i64>> {
        groups_lag(self.kafka()).await
    }

    /// The log file of a process.
    pub fn log_path(&self, s: Service) -> PathBuf {
        self.opts.run_dir.join("logs").join(format!("{}.log", s.name()))
    }

    /// The value of `name` summed over `url`'s `/metrics` (None when it does not answer).
    pub async fn metric(url: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let page = Self::metrics_page(url).await?;
        Some(telemetry::metrics::sum_samples(&page, name, labels))
    }

    /// `url`'s `/metrics` page (None when it does not answer within 2 s).
    pub async fn metrics_page(url: &str) -> Option<String> {
        reqwest::Client::new()
            .get(format!("{url}/metrics"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    /// The partitions the instance at `url` says its group gave it
    /// (`consumer_partitions_assigned == 1`), None when it does not answer.
    pub async fn assigned_partitions(url: &str) -> Option<BTreeSet<(String, i32)>> {
        let page = Self::metrics_page(url).await?;
        Some(
            page.lines()
                .filter_map(|l| l.strip_prefix("consumer_partitions_assigned{"))
                .filter_map(|rest| {
                    let (labels, value) = rest.split_once("} ")?;
                    (value.trim() == "1").then_some(())?;
                    let label = |name: &str| {
                        labels
                            .split(',')
                            .filter_map(|kv| kv.split_once('='))
                            .find(|(k, _)| *k == name)
                            .map(|(_, v)| v.trim_matches('"').to_owned())
                    };
                    Some((label("topic")?, label("partition")?.parse().ok()?))
                })
                .collect(),
        )
    }

    /// Waits until the instances at `urls` hold disjoint, non-empty shares
    /// of all of `topic`'s partitions (the stack's count), or `timeout`;
    /// returns the shares.
    pub async fn wait_shared(
        &self,
        urls: &[String],
        topic: &str,
        timeout: Duration,
    ) -> anyhow::Result<Vec<BTreeSet<(String, i32)>>> {
        let all: BTreeSet<(String, i32)> = (0..self.opts.partitions).map(|p| (topic.to_owned(), p)).collect();
        let end = Instant::now() + timeout;
        loop {
            let mut shares = Vec::new();
            for url in urls {
                shares.push(Self::assigned_partitions(url).await.unwrap_or_default());
            }
            let union: BTreeSet<_> = shares.iter().flatten().cloned().collect();
            let total: usize = shares.iter().map(BTreeSet::len).sum();
            if union == all && total == all.len() && shares.iter().all(|s| !s.is_empty()) {
                return Ok(shares);
            }
            anyhow::ensure!(
                Instant::now() < end,
                "{topic}: partitions not shared by {urls:?} within {timeout:?}: {shares:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// Each of the saga's consumer groups' lag on its topic at `brokers`, in
/// the order of `contract::topics::consumers::ALL` (`None`: not read).
pub async fn groups_lag(brokers: kafka::KafkaArgs) -> Vec<Option<i64>> {
    tokio::task::spawn_blocking(move || {
        contract::topics::consumers::ALL
            .iter()
            .map(|c| kafka::group_lag(&brokers, c.name, c.topic, Duration::from_secs(5)).ok())
            .collect()
    })
    .await
    // A reader that panicked read nothing: every group unknown, never "0 behind".
    .unwrap_or_else(|_| vec![None; contract::topics::consumers::ALL.len()])
}
