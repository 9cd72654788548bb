//! A long command (bench, chaos, demo) stopped by Ctrl-C or SIGTERM must not
//! leave its stack behind: without a handler the signal ends this process at
//! once, no `Drop` runs, and the services, the Kafka nodes and the
//! `eo_<run>_*` databases outlive it.

use std::future::Future;

/// Runs `work` to its end, or until this process receives SIGINT or SIGTERM.
/// Interrupted, `work` is dropped — and with it every stack it holds, whose
/// `Drop` kills the stack's processes and drops its databases — and the
/// command fails with "interrupted".
pub async fn unless_interrupted<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let stop = service_kit::shutdown::on_signal();
    tokio::select! {
        result = work => result,
        () = stop.cancelled() => anyhow::bail!("interrupted: the stack's processes were stopped and its databases dropped"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::unless_interrupted;

    /// Set when dropped: stands for a stack, whose `Drop` cleans up.
    struct Guard(Arc<AtomicBool>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_sigterm_drops_the_work_and_its_stack_and_fails_the_command() {
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Guard(dropped.clone());
        let work = async move {
            let _stack = guard;
            std::future::pending::<()>().await;
            Ok(())
        };
        // SIGTERM to this test process, once the handler is installed (the
        // first poll of `unless_interrupted`).
        tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            crate::signal(std::process::id(), nix::sys::signal::Signal::SIGTERM).expect("the signal is sent");
        });
        let result = tokio::time::timeout(Duration::from_secs(10), unless_interrupted(work))
            .await
            .expect("the signal ends the wait");
        let error = result.expect_err("an interrupted command fails");
        assert!(error.to_string().contains("interrupted"), "{error}");
        assert!(dropped.load(Ordering::SeqCst), "the work, and its stack, were dropped");
    }

    #[tokio::test]
    async fn work_that_ends_is_its_own_result() {
        assert_eq!(unless_interrupted(async { Ok(7) }).await.unwrap(), 7);
    }
}
