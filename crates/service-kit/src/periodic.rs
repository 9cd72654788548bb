//! Periodic work — reapers, retention purges, deadline scans, gauges — in
//! one loop: [`every`] runs a step each period until shutdown, and
//! [`in_batches`] repeats a bounded delete until it comes up short, so each
//! statement stays short and holds no long lock.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Supervisor;

/// Runs `step` every `period` until `shutdown`, the first run one period
/// after the start. A step that fails is logged as a warning naming `task`
/// and runs again at the next period; a step that overruns delays the next
/// one (periods are not made up). Returns when `shutdown` is cancelled —
/// between steps, or by dropping a step in flight (every step here is a
/// transaction, rolled back when dropped).
pub async fn every<F, Fut, E>(task: &str, period: Duration, shutdown: CancellationToken, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            done = step() => if let Err(e) = done {
                tracing::warn!(task, error = %e, "periodic task failed; next try in one period");
            },
        }
    }
}

/// Runs `step(limit)` — a bounded delete returning the rows it removed —
/// until one removes fewer than `limit`; returns the total.
pub async fn in_batches<F, Fut, E>(limit: i64, mut step: F) -> Result<u64, E>
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    let mut total = 0;
    loop {
        let n = step(limit).await?;
        total += n;
        if n < limit.max(0) as u64 {
            return Ok(total);
        }
    }
}

impl Supervisor {
    /// [`every`] as the supervised task `task`: `step()` each `period`
    /// until the supervisor's token is cancelled.
    pub fn spawn_every<F, Fut, E>(&mut self, task: impl Into<String>, period: Duration, step: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: Display,
    {
        let (task, token) = (task.into(), self.token());
        self.spawn(task.clone(), async move { every(&task, period, token, step).await });
    }
}

/// Rows a purge deletes per statement.
pub const PURGE_BATCH: i64 = 1_000;

/// How often a retention purge runs: often enough that each run deletes a
/// few seconds' worth of rows — never a minute's or an hour's at once, a
/// delete storm the hot path's latency would show — and that every purge
/// runs inside any bench trial.
pub const PURGE_EVERY: Duration = Duration::from_secs(10);

/// The metrics of this module, for their `# HELP` (`telemetry::metrics::describe`).
pub const METRICS: &[telemetry::metrics::Description] = telemetry::descriptions![
    counter "purged_rows_total": "Rows a retention purge deleted, by task.",
];

impl Supervisor {
    /// A retention purge as the supervised task `task`: every `period`,
    /// `purge(state, limit)` — a bounded delete returning its row count —
    /// repeated [`in_batches`] of [`PURGE_BATCH`] until it comes up short;
    /// the rows removed are logged when there were any.
    pub fn spawn_purge<S, F, Fut, E>(&mut self, task: impl Into<String>, period: Duration, state: S, purge: F)
    where
        S: Clone + Send + Sync + 'static,
        F: Fn(S, i64) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<u64, E>> + Send,
        E: Display + Send + 'static,
    {
        let task = task.into();
        let label = task.clone();
        self.spawn_every(task, period, move || {
            let (state, purge, label) = (state.clone(), purge.clone(), label.clone());
            async move {
                let rows = in_batches(PURGE_BATCH, |n| purge(state.clone(), n)).await?;
                telemetry::metrics::incr_by("purged_rows_total", &[("task", &label)], rows);
                if rows > 0 {
                    tracing::info!(task = %label, rows, "purged");
                }
                Ok::<_, E>(())
            }
        });
    }
}
