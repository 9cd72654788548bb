//! `cargo xtask bench --trace-cost`: what exporting traces costs, as one
//! paired run on one stack — the same load with tracing export off, then on
//! (every service restarted with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at an
//! OTLP receiver in this process, which decodes and keeps every span).
//!
//! Per mode: CPU per order at a fixed open-loop rate, and the drain rate of
//! a burst — the saga's throughput when it is the bottleneck.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::driver::Client;
use crate::otlp::Receiver;
use crate::stack::{Service, Stack};

const SERVICES: [Service; 5] = [
    Service::Gateway,
    Service::Inventory,
    Service::Payment,
    Service::OrderApi,
    Service::Relay,
];

/// One mode's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Mode {
    /// `off` or `on`.
    pub tracing: &'static str,
    /// Fixed rate of the CPU trial, orders/s.
    pub rate: f64,
    /// CPU of every process per order at that rate, ms.
    pub cpu_ms_per_order: f64,
    /// Burst: orders placed and their drain rate, orders/s.
    pub burst_orders: usize,
    /// Drain rate of the burst, orders/s.
    pub drain_per_sec: f64,
    /// Spans the receiver got during this mode.
    pub spans: usize,
}

/// The paired run.
#[derive(Debug, Clone, Serialize)]
pub struct TraceCost {
    /// When.
    pub date: String,
    /// Off, then on.
    pub modes: Vec<Mode>,
    /// Burst drain rate lost with tracing on, percent of off.
    pub throughput_cost_pct: f64,
    /// CPU per order added with tracing on, percent of off.
    pub cpu_cost_pct: f64,
}

async fn mode(
    stack: &Stack,
    client: &Client,
    tracing: &'static str,
    rate: f64,
    receiver: &Receiver,
) -> anyhow::Result<Mode> {
    let orders_db = stack.db_url("orders");
    let spans_before = receiver.span_count();
    eprintln!("trace cost: tracing {tracing}: {rate:.0} orders/s for 30 s");
    let trial = super::trial(client, &orders_db, rate, Duration::from_secs(30)).await?;
    let cpu: f64 = trial.cpu_ms_per_order.values().sum();
    let burst = super::burst(client, &orders_db, rate * 3.0, Duration::from_secs(5)).await?;
    Ok(Mode {
        tracing,
        rate,
        cpu_ms_per_order: cpu,
        burst_orders: burst.placed,
        drain_per_sec: burst.drain_per_sec,
        spans: receiver.span_count() - spans_before,
    })
}

/// Runs the pair on `stack` (fresh, tracing export off).
pub async fn run(stack: &mut Stack, rate: f64) -> anyhow::Result<TraceCost> {
    let receiver = Receiver::start().await?;
    let client = Client::new(stack, Duration::from_secs(10))?;
    client.seed_stock("WIDGET", 2_000_000_000).await?;
    let off = mode(stack, &client, "off", rate, &receiver).await?;
    for s in SERVICES {
        stack.set_env(s, "OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint());
        stack.restart(s).await?;
    }
    let on = mode(stack, &client, "on", rate, &receiver).await?;
    anyhow::ensure!(on.spans > 0, "tracing on, yet no span reached the receiver");
    anyhow::ensure!(off.spans == 0, "tracing off, yet spans were exported");
    Ok(TraceCost {
        date: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        throughput_cost_pct: 100.0 * (off.drain_per_sec - on.drain_per_sec) / off.drain_per_sec,
        cpu_cost_pct: 100.0 * (on.cpu_ms_per_order - off.cpu_ms_per_order) / off.cpu_ms_per_order,
        modes: vec![off, on],
    })
}

/// The pair as a markdown table.
pub fn markdown(c: &TraceCost) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Cost of trace export — {}\n\n{}\n", c.date, super::machine());
    let _ = writeln!(
        s,
        "| tracing export | CPU per order at {:.0}/s (ms) | burst drain (orders/s) | spans exported |\n|---|---:|---:|---:|",
        c.modes[0].rate
    );
    for m in &c.modes {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.0} ({} orders) | {} |",
            m.tracing, m.cpu_ms_per_order, m.drain_per_sec, m.burst_orders, m.spans
        );
    }
    let _ = writeln!(
        s,
        "\nThroughput cost (burst drain, on vs off): **{:.1} %**; CPU per order: {:+.1} %.",
        c.throughput_cost_pct, c.cpu_cost_pct
    );
    s
}
