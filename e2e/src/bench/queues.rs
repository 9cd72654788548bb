//! The queues behind the hot path, second by second through a trial and
//! its drain: each service's outbox rows not yet published, the
//! confirmation notices not yet sent, each saga consumer group's lag. A
//! rate is sustained only when every one of them stays bounded and drains
//! — an orders backlog that keeps up says nothing of a notice worker that
//! falls behind, or of a relay whose table grows.

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{Connection as _, PgConnection};

use crate::Stack;

/// The databases whose outbox is sampled.
const OUTBOXES: [&str; 3] = ["orders", "inventory", "payments"];

/// Longest a trial's queues may take to empty after its orders drained.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// One queue through a trial.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Queue {
    /// What it counts.
    pub name: String,
    /// Its length, second by second over the window and the drain
    /// (`-1`: not read that second).
    pub series: Vec<i64>,
    /// Its longest.
    pub peak: i64,
    /// Mean of the window's last quarter minus mean of its second quarter.
    pub growth: f64,
    /// Seconds after the orders drained until it was empty (`None`: not within [`DRAIN_LIMIT`]).
    pub drained_secs: Option<f64>,
}

impl Queue {
    /// Bounded: it grew by at most half a second of arrivals (or 20) from
    /// the window's second quarter to its last, and it emptied.
    pub fn kept_up(&self, rate: f64) -> bool {
        self.growth <= (0.5 * rate).max(20.0) && self.drained_secs.is_some()
    }
}

/// Every queue of a trial.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Queues {
    /// One per outbox, the notices, one per consumer group.
    pub queues: Vec<Queue>,
}

impl Queues {
    /// The queues that did not keep up at `rate` (empty: all did).
    pub fn behind(&self, rate: f64) -> Vec<&str> {
        self.queues
            .iter()
            .filter(|q| !q.kept_up(rate))
            .map(|q| q.name.as_str())
            .collect()
    }
}

/// The queues' names, in a sample's order.
fn names() -> Vec<String> {
    OUTBOXES
        .iter()
        .map(|db| format!("outbox pending ({db})"))
        .chain(["notices pending".to_owned()])
        .chain(
            contract::topics::consumers::ALL
                .iter()
                .map(|c| format!("lag ({})", c.name)),
        )
        .collect()
}

/// Where the queues are read: the outboxes' databases, the brokers.
#[derive(Debug, Clone)]
struct Source {
    urls: Vec<String>,
    brokers: kafka::KafkaArgs,
}

impl Source {
    fn of(stack: &Stack) -> Self {
        Self {
            urls: OUTBOXES.iter().map(|db| stack.db_url(db)).collect(),
            brokers: stack.kafka(),
        }
    }
}

/// One reading of every queue (`-1` where one could not be read).
async fn sample(source: &Source, dbs: &mut [Option<PgConnection>]) -> Vec<i64> {
    let mut out = Vec::new();
    for (url, conn) in source.urls.iter().zip(dbs.iter_mut()) {
        if conn.is_none() {
            *conn = PgConnection::connect(url).await.ok();
        }
        let n = match conn {
            Some(c) => sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE parked_at IS NULL")
                .fetch_one(c)
                .await
                .ok(),
            None => None,
        };
        out.push(n.unwrap_or(-1));
    }
    let notices = match &mut dbs[0] {
        Some(c) => sqlx::query_scalar::<_, i64>("SELECT count(*) FROM notices WHERE status = 'PENDING'")
            .fetch_one(c)
            .await
            .ok(),
        None => None,
    };
    out.push(notices.unwrap_or(-1));
    out.extend(
        crate::stack::groups_lag(source.brokers.clone())
            .await
            .into_iter()
            .map(|l| l.unwrap_or(-1)),
    );
    out
}

/// Samples every queue once a second from [`Sampler::start`] until
/// [`Sampler::finish`].
pub struct Sampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Vec<i64>>>,
}

impl Sampler {
    /// Starts sampling `stack`'s queues.
    pub fn start(stack: &Stack) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let source = Source::of(stack);
        let task = tokio::spawn(async move {
            let mut dbs: Vec<Option<PgConnection>> = OUTBOXES.iter().map(|_| None).collect();
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => samples.push(sample(&source, &mut dbs).await),
                }
            }
            samples
        });
        Self { stop, task }
    }

    /// Stops sampling after the trial's window of `window_secs` and its
    /// orders' drain, waits up to [`DRAIN_LIMIT`] for every queue to
    /// empty, and returns each queue's figures.
    pub async fn finish(self, stack: &Stack, window_secs: usize) -> Queues {
        let end = Instant::now() + DRAIN_LIMIT;
        let names = names();
        let mut drained: Vec<Option<f64>> = vec![None; names.len()];
        let mut dbs: Vec<Option<PgConnection>> = OUTBOXES.iter().map(|_| None).collect();
        let (started, source) = (Instant::now(), Source::of(stack));
        loop {
            let now = sample(&source, &mut dbs).await;
            for (d, n) in drained.iter_mut().zip(&now) {
                if d.is_none() && *n == 0 {
                    *d = Some(started.elapsed().as_secs_f64());
                }
            }
            if drained.iter().all(Option::is_some) || Instant::now() >= end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let _ = self.stop.send(true);
        let samples = self.task.await.unwrap_or_default();
        let queues = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let series: Vec<i64> = samples.iter().map(|s| s.get(i).copied().unwrap_or(-1)).collect();
                let window = &series[..window_secs.min(series.len())];
                Queue {
                    name,
                    peak: series.iter().copied().max().unwrap_or(0),
                    growth: growth(window),
                    drained_secs: drained[i],
                    series,
                }
            })
            .collect();
        Queues { queues }
    }
}

/// Mean of the last quarter of `window` minus mean of its second quarter
/// (unread seconds left out).
fn growth(window: &[i64]) -> f64 {
    let quarter = |q: usize| {
        let part: Vec<i64> = window[window.len() * q / 4..window.len() * (q + 1) / 4]
            .iter()
            .copied()
            .filter(|n| *n >= 0)
            .collect();
        part.iter().sum::<i64>() as f64 / part.len().max(1) as f64
    };
    quarter(3) - quarter(1)
}

#[cfg(test)]
mod tests {
    use super::{growth, Queue};

    #[test]
    fn a_queue_that_grows_or_never_empties_did_not_keep_up() {
        let steady = [5, 6, 5, 7, 6, 5, 6, 5];
        assert!(growth(&steady).abs() < 1.0);
        let climbing: Vec<i64> = (0..40).map(|s| s * 10).collect();
        assert!(growth(&climbing) > 100.0);
        let q = |growth, drained_secs| Queue {
            growth,
            drained_secs,
            ..Queue::default()
        };
        assert!(q(0.0, Some(1.0)).kept_up(100.0));
        assert!(!q(200.0, Some(1.0)).kept_up(100.0), "it grew");
        assert!(!q(0.0, None).kept_up(100.0), "it never emptied");
        // Unread seconds are not counted as empty ones.
        assert!(growth(&[-1, -1, 10, 10, 10, 10, -1, 10]).abs() < 1e-9);
    }
}
