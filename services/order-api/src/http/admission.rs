//! Admission control: the API takes on only the work it can finish in time.
//!
//! Past capacity an API that admits every request fails everyone: requests
//! queue for the database pool beyond the clients' timeouts, the clients
//! retry, and the retries queue too, so goodput falls as load rises. Here:
//!
//! - **Bounded work in flight**: at most `HTTP_MAX_IN_FLIGHT` requests are
//!   served at once; one more is answered at once with 503 and
//!   `Retry-After` — before its key is checked or its body read, so a
//!   refusal costs nothing.
//! - **A deadline**: an admitted request has `HTTP_REQUEST_DEADLINE_MS`
//!   (shorter than a client's timeout) to reach its transaction: reading
//!   its body, checking its key, tokenising its card and taking a database
//!   connection all happen within it. Past it, 503 with `Retry-After`:
//!   nothing was written, and the client retries with its key.
//! - **A transaction is never cut**: once a request has its connection, its
//!   transaction runs to its end in a task of its own ([`Deadline::commit`]),
//!   holding the request's place in flight, whether or not the client is
//!   still there. Dropping a request's future mid-transaction (a client gone,
//!   a timeout) left connections with a transaction open (PostgreSQL's
//!   "there is already a transaction in progress"); a client that left
//!   before its transaction began costs no more work: its future is dropped
//!   and nothing was written.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::http::ApiError;

/// The API port's admission limits.
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionArgs {
    /// Requests served at once on the API port; one more is refused at once
    /// (503, `Retry-After`).
    #[arg(long, env = "HTTP_MAX_IN_FLIGHT", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_in_flight: u32,
    /// Milliseconds an admitted request has to reach its transaction (its
    /// body, its key, its card's token, a database connection); past it,
    /// 503 and `Retry-After`, nothing written. Keep it under the clients'
    /// timeout, so that they hear the answer.
    #[arg(long, env = "HTTP_REQUEST_DEADLINE_MS", default_value_t = 1_500,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_ms: u64,
}

impl Default for AdmissionArgs {
    fn default() -> Self {
        Self {
            max_in_flight: 64,
            deadline_ms: 1_500,
        }
    }
}

/// The API port's admission: its places in flight and its deadline.
#[derive(Debug, Clone)]
pub struct Admission {
    places: Arc<Semaphore>,
    deadline: Duration,
}

impl Admission {
    /// Admission with `args`' limits.
    pub fn new(args: &AdmissionArgs) -> Self {
        Self {
            places: Arc::new(Semaphore::new(args.max_in_flight as usize)),
            deadline: Duration::from_millis(args.deadline_ms),
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self, of: &AdmissionArgs) -> usize {
        of.max_in_flight as usize - self.places.available_permits()
    }
}

/// An admitted request's deadline and place in flight (in its extensions).
#[derive(Debug, Clone)]
pub struct Deadline {
    at: Instant,
    /// Set when the request's transaction began: from then on the deadline
    /// no longer cuts it.
    committed: Arc<AtomicBool>,
    place: Arc<OwnedSemaphorePermit>,
}

impl Deadline {
    /// A deadline `within` from now, without a place (handlers' tests).
    pub fn after(within: Duration) -> Self {
        let places = Arc::new(Semaphore::new(1));
        Self {
            at: Instant::now() + within,
            committed: Arc::default(),
            place: Arc::new(places.try_acquire_owned().expect("a fresh semaphore has its permit")),
        }
    }

    /// `work` (nothing written yet: a lookup, a connection taken) within
    /// the deadline, or the deadline's refusal.
    pub async fn within<F: Future>(&self, work: F) -> Result<F::Output, ApiError> {
        tokio::time::timeout_at(self.at, work)
            .await
            .map_err(|_| ApiError::Overloaded(Overload::Deadline))
    }

    /// Runs `transaction` to its end in a task of its own, holding the
    /// request's place in flight: neither the deadline nor a client that
    /// leaves cuts it. Refused (nothing run) when the deadline has passed.
    pub async fn commit<T: Send + 'static>(
        &self,
        transaction: impl Future<Output = Result<T, ApiError>> + Send + 'static,
    ) -> Result<T, ApiError> {
        if Instant::now() >= self.at {
            return Err(ApiError::Overloaded(Overload::Deadline));
        }
        self.committed.store(true, Ordering::SeqCst);
        let place = self.place.clone();
        // In the request's span: the trace context the outbox row carries
        // on to the participants comes from it.
        let task = tokio::spawn(
            async move {
                let done = transaction.await;
                drop(place);
                done
            }
            .instrument(tracing::Span::current()),
        );
        task.await
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("the request's transaction panicked: {e}")))?
    }
}

/// Why an admitted or arriving request was turned away under load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overload {
    /// Every place in flight is taken.
    Busy,
    /// The request did not reach its transaction within its deadline.
    Deadline,
}

impl Overload {
    /// Its metric label (`api_refusals_total{reason}`).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Busy => "overloaded",
            Self::Deadline => "deadline",
        }
    }

    /// Its sentence in the problem document.
    pub fn detail(self) -> &'static str {
        match self {
            Self::Busy => "the API is at its limit of requests in flight; nothing was stored: retry after Retry-After",
            Self::Deadline => {
                "the request did not reach its transaction in time; nothing was stored: retry with the same key after Retry-After"
            }
        }
    }
}

/// The 503 of an overload, with `Retry-After: 1` (counted in
/// `api_refusals_total` as it becomes a response).
pub fn refusal(why: Overload) -> Response {
    ApiError::Overloaded(why).into_response()
}

/// The middleware, outermost on the API router: a place in flight or an
/// immediate 503; then the request within its deadline until its
/// transaction begins.
pub async fn middleware(State(admission): State<Admission>, mut req: Request, next: Next) -> Response {
    let Ok(place) = admission.places.clone().try_acquire_owned() else {
        return refusal(Overload::Busy);
    };
    let deadline = Deadline {
        at: Instant::now() + admission.deadline,
        committed: Arc::default(),
        place: Arc::new(place),
    };
    req.extensions_mut().insert(deadline.clone());
    let run = next.run(req);
    tokio::pin!(run);
    tokio::select! {
        biased;
        resp = &mut run => resp,
        () = tokio::time::sleep_until(deadline.at) => {
            if deadline.committed.load(Ordering::SeqCst) {
                // Its transaction runs in its own task: its answer is the truth.
                run.await
            } else {
                refusal(Overload::Deadline)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, StatusCode};

    #[tokio::test]
    async fn work_before_the_transaction_is_cut_at_the_deadline_and_a_transaction_never() {
        let deadline = Deadline::after(Duration::from_millis(100));
        let slow = deadline.within(tokio::time::sleep(Duration::from_millis(200))).await;
        assert!(matches!(slow, Err(ApiError::Overloaded(Overload::Deadline))));
        // Past the deadline, no transaction starts.
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let late = deadline
            .commit(async move {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert!(matches!(late, Err(ApiError::Overloaded(Overload::Deadline))));
        assert!(!ran.load(Ordering::SeqCst));

        // A transaction begun in time ends, though its caller is dropped.
        let deadline = Deadline::after(Duration::from_millis(100));
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        let caller = deadline.commit(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            flag.store(true, Ordering::SeqCst);
            Ok(())
        });
        let _ = tokio::time::timeout(Duration::from_millis(10), caller).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(ended.load(Ordering::SeqCst), "the transaction was cut");
    }

    #[tokio::test]
    async fn a_request_past_the_places_in_flight_is_refused_at_once() {
        use axum::routing::get;
        let args = AdmissionArgs {
            max_in_flight: 1,
            deadline_ms: 60_000,
        };
        let admission = Admission::new(&args);
        let (entered, release) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let (e, r) = (entered.clone(), release.clone());
        let app = axum::Router::new()
            .route(
                "/",
                get(move || {
                    let (e, r) = (e.clone(), r.clone());
                    async move {
                        e.notify_one();
                        r.notified().await;
                        "done"
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(admission.clone(), middleware));
        let call = |app: axum::Router| async move {
            use tower::ServiceExt as _;
            let req = axum::http::Request::get("/").body(axum::body::Body::empty()).unwrap();
            app.oneshot(req).await.unwrap()
        };
        let first = tokio::spawn(call(app.clone()));
        entered.notified().await;
        assert_eq!(admission.in_flight(&args), 1);
        let second = call(app.clone()).await;
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(second.headers()[header::RETRY_AFTER], "1");
        release.notify_one();
        assert_eq!(first.await.unwrap().status(), StatusCode::OK);
        assert_eq!(admission.in_flight(&args), 0);
        // The place is free again.
        let third = tokio::spawn(call(app));
        entered.notified().await;
        release.notify_one();
        assert_eq!(third.await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_request_that_misses_its_deadline_is_a_503_and_one_committed_is_answered() {
        use axum::routing::get;
        let args = AdmissionArgs {
            max_in_flight: 4,
            deadline_ms: 100,
        };
        let admission = Admission::new(&args);
        let app = axum::Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    "late"
                }),
            )
            .route(
                "/committed",
                get(|axum::Extension(deadline): axum::Extension<Deadline>| async move {
                    deadline
                        .commit(async {
                            tokio::time::sleep(Duration::from_millis(400)).await;
                            Ok("written")
                        })
                        .await
                        .map_err(|e| e.to_string())
                }),
            )
            .layer(axum::middleware::from_fn_with_state(admission.clone(), middleware));
        let call = |path: &'static str| {
            let app = app.clone();
            async move {
                use tower::ServiceExt as _;
                let req = axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
                app.oneshot(req).await.unwrap()
            }
        };
        let slow = call("/slow").await;
        assert_eq!(slow.status(), StatusCode::SERVICE_UNAVAILABLE);
        let committed = call("/committed").await;
        assert_eq!(committed.status(), StatusCode::OK);
        assert_eq!(admission.in_flight(&args), 0);
    }
}
