//! `cargo xtask bench --trace-cost`: what tracing costs, as one run on one
//! stack in three modes under the same load — OpenTelemetry switched off
//! (`OTEL_SDK_DISABLED=true`: no spans, no ids), spans created but not
//! exported (the default without an endpoint), and spans exported to an OTLP
//! receiver in this process (`OTEL_EXPORTER_OTLP_ENDPOINT`). Every service
//! is restarted between modes.
//!
//! Per mode: CPU per order at a fixed open-loop rate, and the drain rate of
//! a burst — the saga's throughput when it is the bottleneck.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::mix::{Load, Mix};
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
    /// `disabled`, `spans` (no export) or `export`.
    pub tracing: &'static str,
    /// Fixed rate of the CPU trial, orders/s.
    pub rate: f64,
    /// CPU of every process per order at that rate, ms.
    pub cpu_ms_per_order: f64,
    /// The same, per process.
    pub cpu_ms_by_process: BTreeMap<String, f64>,
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
    /// Disabled, spans, export.
    pub modes: Vec<Mode>,
    /// Burst drain rate lost with spans (no export), percent of disabled.
    pub spans_throughput_cost_pct: f64,
    /// CPU per order added by spans (no export), percent of disabled.
    pub spans_cpu_cost_pct: f64,
    /// Burst drain rate lost with export on, percent of disabled.
    pub export_throughput_cost_pct: f64,
    /// CPU per order added with export on, percent of disabled.
    pub export_cpu_cost_pct: f64,
}

async fn mode(
    stack: &Stack,
    load: &Load,
    tracing: &'static str,
    rate: f64,
    receiver: &Receiver,
) -> anyhow::Result<Mode> {
    let orders_db = stack.db_url("orders");
    let spans_before = receiver.span_count();
    eprintln!("trace cost: tracing {tracing}: {rate:.0} orders/s for 30 s");
    let trial = super::search::trial(stack, load, rate, Duration::from_secs(30)).await?;
    let cpu: f64 = trial.cpu_ms_per_order.values().sum();
    let burst = super::burst(load, &orders_db, rate * 3.0, Duration::from_secs(5)).await?;
    Ok(Mode {
        tracing,
        rate,
        cpu_ms_per_order: cpu,
        cpu_ms_by_process: trial.cpu_ms_per_order,
        burst_orders: burst.placed,
        drain_per_sec: burst.drain_per_sec,
        spans: receiver.span_count() - spans_before,
    })
}

/// Runs the three modes on `stack` (fresh).
pub async fn run(stack: &mut Stack, rate: f64) -> anyhow::Result<TraceCost> {
    let receiver = Receiver::start().await?;
    let client = Client::new(stack, Duration::from_secs(10))?;
    client.seed_stock("WIDGET", 2_000_000_000).await?;
    let load = Load::on(&client, Mix::single());
    for s in SERVICES {
        stack.set_env(s, "OTEL_SDK_DISABLED", "true");
        stack.restart(s).await?;
    }
    let disabled = mode(stack, &load, "disabled", rate, &receiver).await?;
    for s in SERVICES {
        stack.set_env(s, "OTEL_SDK_DISABLED", "false");
        stack.restart(s).await?;
    }
    let spans = mode(stack, &load, "spans", rate, &receiver).await?;
    for s in SERVICES {
        stack.set_env(s, "OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint());
        stack.restart(s).await?;
    }
    let export = mode(stack, &load, "export", rate, &receiver).await?;
    anyhow::ensure!(export.spans > 0, "export on, yet no span reached the receiver");
    anyhow::ensure!(
        disabled.spans == 0 && spans.spans == 0,
        "export off, yet spans were exported"
    );
    let drain = |m: &Mode| 100.0 * (disabled.drain_per_sec - m.drain_per_sec) / disabled.drain_per_sec;
    let cpu = |m: &Mode| 100.0 * (m.cpu_ms_per_order - disabled.cpu_ms_per_order) / disabled.cpu_ms_per_order;
    Ok(TraceCost {
        date: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        spans_throughput_cost_pct: drain(&spans),
        spans_cpu_cost_pct: cpu(&spans),
        export_throughput_cost_pct: drain(&export),
        export_cpu_cost_pct: cpu(&export),
        modes: vec![disabled, spans, export],
    })
}

/// The three modes as a markdown table.
pub fn markdown(c: &TraceCost) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Cost of tracing — {}\n\n{}\n", c.date, super::machine());
    let _ = writeln!(
        s,
        "| tracing | CPU per order at {:.0}/s (ms) | burst drain (orders/s) | spans exported |\n|---|---:|---:|---:|",
        c.modes[0].rate
    );
    for m in &c.modes {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.0} ({} orders) | {} |",
            m.tracing, m.cpu_ms_per_order, m.drain_per_sec, m.burst_orders, m.spans
        );
    }
    let _ = writeln!(s, "\nCPU per order by process (ms):\n");
    let _ = writeln!(s, "| process | disabled | spans | export |\n|---|---:|---:|---:|");
    for p in c.modes[0].cpu_ms_by_process.keys() {
        let cell = |m: &Mode| {
            m.cpu_ms_by_process
                .get(p)
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default()
        };
        let _ = writeln!(
            s,
            "| {p} | {} | {} | {} |",
            cell(&c.modes[0]),
            cell(&c.modes[1]),
            cell(&c.modes[2])
        );
    }
    let _ = writeln!(
        s,
        "\nAgainst OpenTelemetry disabled — spans without export: burst drain **{:.1} %** lower, CPU per order {:+.1} %; \
         spans exported: burst drain **{:.1} %** lower, CPU per order {:+.1} %.",
        c.spans_throughput_cost_pct, c.spans_cpu_cost_pct, c.export_throughput_cost_pct, c.export_cpu_cost_pct
    );
    s
}
