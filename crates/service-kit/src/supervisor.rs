//! A service's long-running tasks under one supervisor.
//!
//! The rule (decide, tell, wait): every task — the HTTP server, each
//! consumer, each reaper — runs until the shared token is cancelled. A task
//! that ends before that, with an error or without one, has died: the
//! service turns not-ready at once ([`Health`]), the token is cancelled so
//! the other tasks stop (in-flight work finishes or is left for
//! redelivery), the rest get a grace period, and [`Supervisor::wait`]
//! returns the first failure so the process exits non-zero. An orchestrator
//! then restarts it; nothing limps on with a dead consumer behind a green
//! health check.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long the other tasks get to stop after the token is cancelled.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(15);

/// Liveness of the supervised tasks, shared with the readiness endpoint.
#[derive(Debug, Clone, Default)]
pub struct Health {
    failure: Arc<Mutex<Option<String>>>,
    /// What the service still waits for before it can do its work (a
    /// broker that does not answer yet), each held by a [`Waiting`].
    waiting: Arc<Mutex<Vec<String>>>,
}

impl Health {
    /// `None` while every task runs; why the first one stopped otherwise.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().expect("health lock").clone()
    }

    /// Not ready until the returned guard is dropped: the readiness answer
    /// says `waiting for {what}` meanwhile.
    pub fn wait_for(&self, what: impl Into<String>) -> Waiting {
        let what = what.into();
        self.waiting.lock().expect("health lock").push(what.clone());
        Waiting {
            health: self.clone(),
            what,
        }
    }

    /// What the service still waits for, if anything (the first named).
    pub fn waiting_for(&self) -> Option<String> {
        self.waiting.lock().expect("health lock").first().cloned()
    }

    fn fail(&self, why: String) {
        self.failure.lock().expect("health lock").get_or_insert(why);
    }
}

/// Holds the service not-ready ([`Health::wait_for`]) until dropped.
#[derive(Debug)]
pub struct Waiting {
    health: Health,
    what: String,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiting = self
            .health
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = waiting.iter().position(|w| *w == self.what) {
            waiting.remove(i);
        }
    }
}

/// What a supervised task may return: `()` or `Result<(), E>`.
pub trait TaskExit {
    /// As a result.
    fn into_result(self) -> anyhow::Result<()>;
}

impl TaskExit for () {
    fn into_result(self) -> anyhow::Result<()> {
        Ok(())
    }
}

impl<E: Into<anyhow::Error>> TaskExit for Result<(), E> {
    fn into_result(self) -> anyhow::Result<()> {
        self.map_err(Into::into)
    }
}

/// The tasks of one service process.
pub struct Supervisor {
    shutdown: CancellationToken,
    /// Each task's name, whether it may end before shutdown (a one-shot
    /// job), and how it ended.
    tasks: JoinSet<(String, bool, anyhow::Result<()>)>,
    health: Health,
    grace: Duration,
}

impl Supervisor {
    /// A supervisor whose tasks stop when `shutdown` is cancelled (by a
    /// signal, or by the supervisor itself when a task dies).
    pub fn new(shutdown: CancellationToken) -> Self {
        Self {
            shutdown,
            tasks: JoinSet::new(),
            health: Health::default(),
            grace: DEFAULT_GRACE,
        }
    }

    /// Sets the grace period the tasks get after cancellation.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The token every task must stop on.
    pub fn token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The health handle for the readiness endpoint.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Runs `task` under supervision; `name` says which task died, in the
    /// logs, the readiness answer and the error.
    pub fn spawn<F>(&mut self, name: impl Into<String>, task: F)
    where
        F: Future + Send + 'static,
        F::Output: TaskExit,
    {
        let name = name.into();
        self.tasks.spawn(async move { (name, false, task.await.into_result()) });
    }

    /// Runs a one-shot job under supervision (a backfill, say): unlike a
    /// [`Supervisor::spawn`]ed task it may end before shutdown — its clean
    /// end is logged and the service runs on — but its failure or panic
    /// stops the service as any task's does.
    pub fn spawn_once<F>(&mut self, name: impl Into<String>, job: F)
    where
        F: Future + Send + 'static,
        F::Output: TaskExit,
    {
        let name = name.into();
        self.tasks.spawn(async move { (name, true, job.await.into_result()) });
    }

    /// Serves `app` on `listener` within `limits` ([`crate::serve`]) as the
    /// task `http` until shutdown, for callers that are our own services
    /// (their `traceparent` is the parent of each request's span).
    pub fn serve(&mut self, listener: TcpListener, app: Router, limits: crate::ServeArgs) {
        self.serve_for(listener, app, limits, crate::http::Caller::Ours);
    }

    /// [`Supervisor::serve`] for a public port: a client's `traceparent`
    /// is linked, not followed ([`crate::http::trace_public`]).
    pub fn serve_public(&mut self, listener: TcpListener, app: Router, limits: crate::ServeArgs) {
        self.serve_for(listener, app, limits, crate::http::Caller::Public);
    }

    fn serve_for(&mut self, listener: TcpListener, app: Router, limits: crate::ServeArgs, caller: crate::http::Caller) {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "listening");
        }
        let app = match caller {
            crate::http::Caller::Ours => app.layer(axum::middleware::from_fn(crate::http::trace)),
            crate::http::Caller::Public => app.layer(axum::middleware::from_fn(crate::http::trace_public)),
        };
        let token = self.token();
        self.spawn("http", crate::serve::serve(listener, app, limits, token));
    }

    /// Serves the admin endpoints — `app`, usually [`crate::admin::router`]
    /// plus the API's description — on their own `listener` as the task
    /// `admin` until shutdown: the port of the orchestrator's probes and
    /// Prometheus, never published beside the API.
    pub fn serve_admin(&mut self, listener: TcpListener, app: Router) {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "admin endpoints listening");
        }
        let token = self.token();
        self.spawn(
            "admin",
            crate::serve::serve(listener, app, crate::ServeArgs::default(), token),
        );
    }

    /// Waits until shutdown, or until a task dies: then turns not-ready,
    /// cancels the rest and waits for them up to the grace period. Returns
    /// the first task's failure (a task ending early without an error is a
    /// failure too), or `Ok` after a clean shutdown.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut first: Option<anyhow::Error> = None;
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                Some(joined) = self.tasks.join_next() => {
                    if let Ok((name, true, Ok(()))) = &joined {
                        tracing::info!(task = name.as_str(), "one-shot job done");
                        continue;
                    }
                    // A task that ended cleanly because shutdown was asked (its
                    // token fired before this select saw the signal) is a clean end.
                    let asked = self.shutdown.is_cancelled() && matches!(&joined, Ok((_, _, Ok(()))));
                    if !asked {
                        let error = died(joined);
                        tracing::error!(error = format!("{error:#}"), "task died: stopping the service");
                        self.health.fail(format!("{error:#}"));
                        first = Some(error);
                        self.shutdown.cancel();
                    }
                    break;
                }
            }
        }
        let deadline = tokio::time::sleep(self.grace);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                joined = self.tasks.join_next() => match joined {
                    None => break,
                    Some(Ok((_, _, Ok(())))) => {}
                    Some(other) => {
                        let error = stopped_with_error(other);
                        tracing::error!(error = format!("{error:#}"), "task failed while stopping");
                        first.get_or_insert(error);
                    }
                },
                _ = &mut deadline => {
                    tracing::error!(tasks = self.tasks.len(), grace = ?self.grace, "tasks still running after the grace period: aborted");
                    self.tasks.abort_all();
                    first.get_or_insert_with(|| anyhow::anyhow!("tasks did not stop within {:?}", self.grace));
                    break;
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

type Joined = Result<(String, bool, anyhow::Result<()>), tokio::task::JoinError>;

/// A task that ended before shutdown: why.
fn died(joined: Joined) -> anyhow::Error {
    match joined {
        Ok((name, _, Ok(()))) => anyhow::anyhow!("task {name} ended before shutdown"),
        Ok((name, _, Err(e))) => e.context(format!("task {name} failed")),
        Err(e) => anyhow::anyhow!("a task panicked: {e}"),
    }
}

/// A task that failed while the service was stopping: why.
fn stopped_with_error(joined: Joined) -> anyhow::Error {
    match joined {
        Ok((name, _, Err(e))) => e.context(format!("task {name} failed")),
        Ok((name, _, Ok(()))) => anyhow::anyhow!("task {name} stopped"),
        Err(e) => anyhow::anyhow!("a task panicked: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_one_shot_job_may_end_early_but_its_failure_stops_the_service() {
        let token = CancellationToken::new();
        let mut sup = Supervisor::new(token.clone());
        sup.spawn_once("backfill", async { anyhow::Ok(()) });
        let t = token.clone();
        sup.spawn("server", async move {
            t.cancelled().await;
            anyhow::Ok(())
        });
        let stop = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            stop.cancel();
        });
        sup.wait().await.expect("a finished job is no death");

        let token = CancellationToken::new();
        let mut sup = Supervisor::new(token.clone());
        sup.spawn_once("backfill", async { anyhow::bail!("gateway refused") });
        let t = token.clone();
        sup.spawn("server", async move {
            t.cancelled().await;
            anyhow::Ok(())
        });
        let err = sup.wait().await.unwrap_err();
        assert!(format!("{err:#}").contains("gateway refused"), "{err:#}");
    }

    #[tokio::test]
    async fn a_clean_shutdown_waits_for_every_task() {
        let token = CancellationToken::new();
        let mut sup = Supervisor::new(token.clone());
        let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for name in ["a", "b"] {
            let (t, s) = (token.clone(), stopped.clone());
            sup.spawn(name, async move {
                t.cancelled().await;
                s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        let health = sup.health();
        token.cancel();
        sup.wait().await.unwrap();
        assert_eq!(stopped.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(health.failure(), None);
    }

    #[tokio::test]
    async fn a_task_that_ends_because_shutdown_was_asked_is_a_clean_end() {
        // The task sees the token before `wait` sees the signal: a race
        // once read as "task ended before shutdown". Many rounds so that
        // either side of the race is taken.
        for _ in 0..200 {
            let token = CancellationToken::new();
            let mut sup = Supervisor::new(token.clone());
            let t = sup.token();
            sup.spawn("history retention", async move { t.cancelled().await });
            let health = sup.health();
            let waiting = tokio::spawn(sup.wait());
            tokio::task::yield_now().await;
            token.cancel();
            waiting.await.unwrap().unwrap();
            assert_eq!(health.failure(), None);
        }
    }

    #[tokio::test]
    async fn a_task_that_ends_early_stops_the_rest_and_fails() {
        let mut sup = Supervisor::new(CancellationToken::new());
        let token = sup.token();
        let other_stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = other_stopped.clone();
        sup.spawn("worker", async move {
            token.cancelled().await;
            s.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        sup.spawn("reaper", async {});
        let health = sup.health();
        let err = sup.wait().await.unwrap_err();
        assert!(err.to_string().contains("reaper ended before shutdown"), "{err}");
        assert!(other_stopped.load(std::sync::atomic::Ordering::SeqCst));
        assert!(health.failure().is_some());
    }

    #[tokio::test]
    async fn a_task_that_ignores_the_token_is_aborted_after_the_grace() {
        let token = CancellationToken::new();
        let mut sup = Supervisor::new(token.clone()).grace(Duration::from_millis(100));
        sup.spawn("stubborn", std::future::pending::<()>());
        token.cancel();
        let err = sup.wait().await.unwrap_err();
        assert!(err.to_string().contains("did not stop"), "{err}");
    }
}
