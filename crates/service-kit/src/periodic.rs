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

impl Supervisor {
    /// The reaper of an HTTP service's `Idempotency-Key` table: expired keys
    /// deleted every minute, [`PURGE_BATCH`] at a time.
    pub fn spawn_idempotency_reaper(&mut self, pool: sqlx::PgPool) {
        self.spawn_every("idempotency reaper", Duration::from_secs(60), move || {
            let pool = pool.clone();
            async move { in_batches(PURGE_BATCH, |n| idempotency::reap(&pool, n)).await.map(drop) }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failing_step_runs_again_next_period_and_shutdown_ends_the_loop() {
        let (runs, token) = (Arc::new(AtomicU32::new(0)), CancellationToken::new());
        let task = tokio::spawn({
            let (runs, token) = (runs.clone(), token.clone());
            every("test", Duration::from_secs(60), token, move || {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>("boom")
                }
            })
        });
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the first run waits a period");
        tokio::time::sleep(Duration::from_secs(62)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "a failure does not end the loop");
        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn batches_repeat_until_one_comes_up_short() {
        let mut left = 2_500u64;
        let total = in_batches(1_000, |limit| {
            let n = left.min(limit as u64);
            left -= n;
            async move { Ok::<_, ()>(n) }
        })
        .await
        .unwrap();
        assert_eq!((total, left), (2_500, 0));
    }
}
