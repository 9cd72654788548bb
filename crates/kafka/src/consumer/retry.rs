//! A lane's retries: how long a failing handler is called again before
//! the message counts as one that can never succeed.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::HandleError;

/// How a lane retries: its consumer's name, the transient failures in a
/// row it allows, its shutdown, and the crash mark it sets around each
/// call when the batch is armed ([`super::crashes`]).
pub(super) struct Retry<'a> {
    pub name: &'a str,
    pub max_attempts: u32,
    pub shutdown: &'a CancellationToken,
    pub armed: Option<super::Armed<'a>>,
}

/// Runs the handler, retrying with capped backoff: an unavailable
/// dependency for as long as it takes, a transient failure up to
/// `max_attempts` attempts in a row — then it is permanent, the last error
/// named. Returns `Ok(None)` when shutdown interrupts the retries.
pub(super) async fn handle_with_retry<T, O, H, F>(
    retry: &Retry<'_>,
    handler: &H,
    message: T,
) -> Result<Option<O>, HandleError>
where
    T: Clone,
    H: Fn(T) -> F,
    F: Future<Output = Result<O, HandleError>>,
{
    let name = retry.name;
    let mut delay = Duration::from_millis(50);
    let mut failed = 0u32;
    loop {
        // Dying inside the call leaves the mark; returning takes it back.
        if let Some((watch, msg, arm)) = retry.armed {
            watch
                .commit(msg, arm.offset, super::crashes::Mark::Crashes(arm.before + 1))
                .await;
        }
        let started = std::time::Instant::now();
        let outcome = handler(message.clone()).await;
        if let (Some((watch, msg, arm)), Err(_)) = (retry.armed, &outcome) {
            watch
                .commit(msg, arm.offset, super::crashes::Mark::Crashes(arm.before))
                .await;
        }
        telemetry::metrics::observe(
            "consumer_handler_duration_seconds",
            &[("consumer", name)],
            started.elapsed(),
        );
        let e = match outcome {
            Ok(h) => return Ok(Some(h)),
            Err(e @ HandleError::Permanent(_)) => return Err(e),
            Err(e @ HandleError::Transient(_)) => {
                failed += 1;
                if failed >= retry.max_attempts {
                    return Err(HandleError::permanent(Exhausted {
                        attempts: failed,
                        last: e,
                    }));
                }
                e
            }
            Err(e @ HandleError::Unavailable(_)) => e,
        };
        telemetry::metrics::incr("consumer_transient_errors_total", &[("consumer", name)]);
        tracing::warn!(
            consumer = name,
            error = e.report(),
            ?delay,
            failed,
            "handler failed, retrying"
        );
        tokio::select! {
            _ = retry.shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = next_delay(delay);
    }
}

/// The pause after `delay`: twice as long, up to 5 s.
fn next_delay(delay: Duration) -> Duration {
    (delay * 2).min(Duration::from_secs(5))
}

/// A transient failure that came back every attempt: permanent now, the
/// last failure kept as the cause.
#[derive(Debug, thiserror::Error)]
#[error("{attempts} attempts in a row failed, the last")]
struct Exhausted {
    attempts: u32,
    #[source]
    last: HandleError,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_retry_waits_twice_as_long_each_time_up_to_five_seconds() {
        use std::time::Duration;
        let mut delay = Duration::from_millis(50);
        let mut seen = vec![delay];
        for _ in 0..9 {
            delay = super::next_delay(delay);
            seen.push(delay);
        }
        assert_eq!(seen[1], Duration::from_millis(100));
        assert_eq!(seen[6], Duration::from_millis(3200));
        assert_eq!(*seen.last().unwrap(), Duration::from_secs(5));
    }
}
