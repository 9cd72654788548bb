//! The relay's throughput machinery around the lesson of `core.rs`: up to
//! `in_flight` batches await the broker while the next one is claimed, so
//! the database work of one batch overlaps the broker round trip of the
//! others; an idle relay probes for pending rows; failures pause claiming
//! with a doubling backoff.

use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ClaimOutcome, Publisher, Relay, Round};
use crate::Result;

pub(super) const MIN_BACKOFF: Duration = Duration::from_millis(100);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The end of a pause of `backoff`, which doubles for the next one.
pub(super) fn back_off(backoff: &mut Duration) -> Instant {
    let until = Instant::now() + *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    until
}

/// Counts a claim's outcome: no claim runs any more; one more batch
/// delivering, or nothing to claim until something settles or a probe finds
/// a row.
fn taken(outcome: ClaimOutcome, claiming: &mut bool, delivering: &mut usize, claimable: &mut bool) {
    *claiming = false;
    match outcome {
        ClaimOutcome::Rows => *delivering += 1,
        ClaimOutcome::Empty => *claimable = false,
        ClaimOutcome::Failed => {}
    }
}

/// Sleeps until `deadline` (forever without one).
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

impl<P: Publisher> Relay<P> {
    /// Relays until `shutdown`, as a pipeline: up to `in_flight` claimed
    /// batches await the broker while the next one is claimed. Per-order
    /// order still holds: an in-flight batch keeps its rows pending and
    /// locked, so the head rule keeps every later row of those orders out of
    /// the next claims.
    ///
    /// When nothing is claimable the relay probes for pending rows every
    /// poll interval. A failed claim or a batch the broker did not take
    /// pauses claiming with exponential backoff (the rows stay pending).
    /// On `shutdown` it stops claiming and settles the batches in flight.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut backoff = MIN_BACKOFF;
        // Each batch runs claim → deliver → settle to its end, and says
        // through `claims` what its claim found, as soon as it knows.
        let (claims_tx, mut claims) = mpsc::unbounded_channel();
        let mut batches: FuturesUnordered<BoxFuture<'_, (bool, Result<Round>)>> = FuturesUnordered::new();
        let (mut claiming, mut delivering) = (false, 0usize);
        // Whether a claim may find rows: false after an empty claim, until a
        // batch settles (its orders' next rows become claimable) or a probe
        // finds a pending row.
        let mut claimable = true;
        let mut paused_until: Option<Instant> = None;
        loop {
            let stopping = shutdown.is_cancelled();
            if stopping && batches.is_empty() {
                self.spare.release();
                return;
            }
            let paused = paused_until.is_some_and(|t| Instant::now() < t);
            if !stopping && !claiming && claimable && !paused && delivering < self.in_flight {
                claiming = true;
                let tx = claims_tx.clone();
                batches.push(
                    async move {
                        let mut found = false;
                        let round = self
                            .one_batch(|outcome| {
                                found = matches!(outcome, ClaimOutcome::Rows);
                                let _ = tx.send(outcome);
                            })
                            .await;
                        (found, round)
                    }
                    .boxed(),
                );
            }
            tokio::select! {
                // A claim's outcome is sent before its batch can end: biased,
                // so it is always taken first.
                biased;
                Some(outcome) = claims.recv() => {
                    taken(outcome, &mut claiming, &mut delivering, &mut claimable);
                }
                Some((found, result)) = batches.next(), if !batches.is_empty() => {
                    // Its claim's outcome was sent first, but a batch that
                    // never waited after it (its settling failed at once on
                    // a dropped connection) ends in the same poll: take the
                    // outcome before counting the batch out.
                    while let Ok(outcome) = claims.try_recv() {
                        taken(outcome, &mut claiming, &mut delivering, &mut claimable);
                    }
                    if found {
                        (delivering, claimable) = (delivering - 1, true);
                    }
                    match result {
                        Ok(r) if r.failed == 0 => {
                            if found {
                                backoff = MIN_BACKOFF;
                            }
                        }
                        Ok(r) => {
                            tracing::warn!(source = %self.source, failed = r.failed, ?backoff, "publish failed, backing off");
                            paused_until = Some(back_off(&mut backoff));
                        }
                        Err(e) => {
                            tracing::warn!(source = %self.source, error = %e, ?backoff, "a claim or its settling failed, backing off");
                            paused_until = Some(back_off(&mut backoff));
                        }
                    }
                },
                _ = shutdown.cancelled(), if !stopping => {}
                _ = sleep_until(paused_until), if paused => paused_until = None,
                _ = self.wait_for_rows(), if !claimable && !paused && !stopping => claimable = true,
            }
        }
    }

    /// Returns once a pending row exists: probes every poll interval with
    /// one cheap query (the partial index of pending rows), so an idle relay
    /// costs a few hundred index lookups a minute and wakes within one interval.
    async fn wait_for_rows(&self) {
        loop {
            tokio::time::sleep(self.poll_interval).await;
            let pending = async {
                let mut conn = self.spare.take().await?;
                let pending: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE parked_at IS NULL)")
                    .fetch_one(&mut *conn)
                    .await?;
                self.spare.keep(conn);
                Ok::<_, sqlx::Error>(pending)
            }
            .await;
            // A failed probe: let the claim find out (and back off).
            if pending.unwrap_or(true) {
                return;
            }
        }
    }
}
