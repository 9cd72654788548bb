//! What one order cannot cost less than, and the intake alone.
//!
//! The floor of one order is the work no design of this saga can skip:
//! one commit in PostgreSQL (a bare one: an order-sized row inserted in
//! its own transaction), four broker messages (ReserveStock,
//! StockReserved, ChargePayment, PaymentCaptured: produced and consumed)
//! and two HTTP calls (the client's `POST /orders`, payment's charge). Each
//! is measured alone in the same run as CPU of every process per operation
//! (the database's create loop, the broker's ceiling, a closed loop of
//! trivial HTTP requests), and summed; the stack's CPU per order at its
//! sustained rate is then read as a multiple of it.
//!
//! The intake alone is `POST /orders` with the relay stopped (SIGSTOP):
//! order-api and PostgreSQL take orders and nothing downstream runs. The
//! relay is continued after it and the outbox drains.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde::Serialize;

use super::ceilings::{self, BrokerCeiling, DatabaseCeiling};
use super::load::{self, HttpFigures};
use super::mix::Load;
use crate::stack::{Service, Stack};

/// HTTP calls in one order: the client's `POST /orders` and payment-service's charge.
pub const HTTP_CALLS_PER_ORDER: f64 = 2.0;
/// Commits no order can do without: its creation.
pub const COMMITS_PER_ORDER: f64 = 1.0;

/// The floor of one order, CPU ms of every process.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// One bare commit (an order-sized row in its own transaction, in a tight loop).
    pub commit_ms: f64,
    /// One broker message, produced and consumed.
    pub message_ms: f64,
    /// One trivial HTTP request and its answer (keep-alive, plain HTTP).
    pub http_call_ms: f64,
    /// HTTP calls per second of that loop.
    pub http_calls_per_sec: f64,
    /// The sum: one create commit, four messages, two HTTP calls.
    pub order_ms: f64,
    /// Orders per second the machine's cores would give at the floor.
    pub orders_per_sec: f64,
}

impl Floor {
    /// From the ceilings' CPU figures and an HTTP loop on `stack`.
    pub async fn measure(
        stack: &Stack,
        broker: &BrokerCeiling,
        database: &DatabaseCeiling,
        duration: Duration,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let url = format!("{}/health/live", stack.admin_url(Service::OrderApi));
        let (http_calls_per_sec, http_call_ms) = ceilings::tight_loop(32, duration, move |_| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let status = http.get(&url).send().await?.status();
                anyhow::ensure!(status.is_success(), "{url}: {status}");
                Ok(())
            }
        })
        .await?;
        let order_ms = COMMITS_PER_ORDER * database.bare_commit_cpu_ms
            + ceilings::MESSAGES_PER_ORDER * broker.cpu_ms_per_message
            + HTTP_CALLS_PER_ORDER * http_call_ms;
        Ok(Self {
            commit_ms: database.bare_commit_cpu_ms,
            message_ms: broker.cpu_ms_per_message,
            http_call_ms,
            http_calls_per_sec,
            order_ms,
            orders_per_sec: super::cores() * 1000.0 / order_ms.max(f64::EPSILON),
        })
    }
}

/// `POST /orders` with nothing downstream running.
#[derive(Debug, Clone, Serialize)]
pub struct Intake {
    /// The closed loop's figures.
    pub http: HttpFigures,
    /// CPU of every process per order taken, ms.
    pub cpu_ms_per_order: f64,
    /// Seconds the saga took to finish those orders once the relay went on.
    pub drain_secs: Option<f64>,
}

/// The intake alone: the relay stopped, `clients` closed-loop clients for `duration`.
pub async fn intake(stack: &Stack, load: &Load, clients: usize, duration: Duration) -> anyhow::Result<Intake> {
    eprintln!("bench: POST /orders alone (the relay stopped), closed loop");
    let relay = stack
        .pid(Service::Relay)
        .ok_or_else(|| anyhow::anyhow!("the relay is not running"))?;
    crate::signal(relay, Signal::SIGSTOP)?;
    let cpu = ceilings::Cpu::start();
    let http = load::post_max(load, clients, duration).await;
    let cpu_ms = cpu.ms_per(http.as_ref().map_or(1.0, |h| h.requests as f64));
    crate::signal(relay, Signal::SIGCONT)?;
    let http = http?;
    let started = Instant::now();
    let drained = load::wait_drained(&stack.db_url("orders"), Duration::from_secs(300)).await?;
    Ok(Intake {
        http,
        cpu_ms_per_order: cpu_ms,
        drain_secs: drained.map(|_| started.elapsed().as_secs_f64()),
    })
}
