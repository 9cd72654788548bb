//! The chaos suite: real clients placing orders while real processes are
//! killed, the broker restarts, database connections drop, the gateway
//! misbehaves and duplicates are injected — then the faults stop, the system
//! drains, and every invariant of docs/design.md is checked.
//!
//! Everything random comes from one seed, so a failing run can be replayed:
//! the order mix (`plan`), the idempotency keys and the fault schedule
//! ([`faults`]). The clients (`clients`) retry like careful clients; `drive` runs
//! the phases; [`report`] says what happened.

mod before_log;
mod clients;
mod drive;
mod effects;
pub mod faults;
mod inject;
mod judge;
pub mod layers;
pub mod matrix;
mod picture;
mod plan;
mod provenance;
pub mod report;

use std::path::PathBuf;
use std::time::Duration;

pub use clients::ClientStats;
pub use faults::{Fault, FaultEvent};
pub use inject::{copy_recent, republish_as_new};
pub use layers::LayerOff;
pub use picture::svg;
pub use report::{markdown, Duplicates, Report, Sample};

use crate::stack::{Service, Stack, StackOptions};

/// How to run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Seed of everything random.
    pub seed: u64,
    /// Orders to place.
    pub orders: usize,
    /// The most orders to place: past `orders`, the clients go on at the
    /// same rate while some fault kind has not fired yet — a crash point
    /// fires only on fresh work, so a fast run would otherwise end its load
    /// before its schedule does. `orders` (the default) places exactly
    /// `orders`.
    pub max_orders: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Orders started per second (spreads the load over the fault schedule).
    pub rate_per_sec: f64,
    /// The share of `rate_per_sec` the clients must have offered for the run
    /// to count (0: not checked). A run under load sets it: clients all
    /// stuck behind an outage offer less, and such a run did not test the
    /// load it names — a problem of the run, whose logs are then kept.
    pub offered_floor: f64,
    /// Pause between faults.
    pub fault_interval: Duration,
    /// Upper bound for draining after the faults stop.
    pub quiesce_timeout: Duration,
    /// Negative control: payment-service without deduplication.
    pub negative_control: bool,
    /// One layer of deduplication switched off: the run must fail.
    pub layer_off: Option<LayerOff>,
    /// Print progress lines.
    pub progress: bool,
    /// Where to copy report.json and report.md (besides the run directory).
    pub report_dir: Option<PathBuf>,
    /// Kafka nodes: 3 (the default) is a replicated cluster — topics with 3
    /// replicas and `min.insync.replicas` 2, so the broker fault SIGKILLs one
    /// node while the other two keep accepting `acks=all` writes; 1 is a
    /// single broker, whose restart stops every producer until it is back.
    pub brokers: u32,
    /// The saga's deadlines (order-api's every open state, payment-service's
    /// PENDING operations): past it, a reconciler acts — a rescue the audit
    /// counts. The drain waits for the system to stay unchanged for longer
    /// ([`ChaosConfig::quiet_window`]).
    pub deadline: Duration,
    /// Settings appended to the run's own PostgreSQL's `postgresql.conf`
    /// (empty: its defaults). A removal to try: `synchronous_commit = off`,
    /// under which a crash can lose commits the services had answered for.
    pub postgres_settings: String,
}

impl ChaosConfig {
    /// The CI-sized run: 300 orders at 6/s and more while a fault kind or
    /// crash point has not fired (traffic through the whole schedule: a
    /// crash point fires only on fresh work), every fault kind, a few minutes.
    pub fn ci(seed: u64) -> Self {
        Self {
            seed,
            orders: 300,
            // Past 300, the clients go on at the same rate until every fault
            // kind and every (service, crash point) pair has fired: a crash
            // point fires only on fresh work.
            max_orders: 1_500,
            clients: 8,
            rate_per_sec: 6.0,
            offered_floor: 0.0,
            fault_interval: Duration::from_millis(800),
            quiesce_timeout: Duration::from_secs(180),
            negative_control: false,
            layer_off: None,
            progress: true,
            report_dir: None,
            brokers: 3,
            deadline: Duration::from_secs(30),
            postgres_settings: String::new(),
        }
    }

    /// How long the system must stay unchanged before the audit: the
    /// deadline, plus a reconciler's scan interval (5 s) and a margin.
    pub fn quiet_window(&self) -> Duration {
        self.deadline + Duration::from_secs(10)
    }
}

/// Runs the suite on a fresh stack and returns its report.
pub async fn run(cfg: &ChaosConfig) -> anyhow::Result<Report> {
    let label = match (cfg.negative_control, cfg.layer_off) {
        (true, _) => "chaos-neg".to_owned(),
        (false, Some(layer)) => format!("chaos-off-{}", layer.name()),
        (false, None) => "chaos".to_owned(),
    };
    let mut opts = StackOptions::ephemeral(&label.replace('-', "_"))?;
    opts.gateway_proxy = true;
    opts.brokers = cfg.brokers;
    // Its own server, so that the schedule can crash it.
    opts.own_postgres = Some(cfg.postgres_settings.clone());
    // Each process under a uid of its own, so that a partition can cut it.
    opts.isolated_uids = true;
    opts.extra_env
        .push((Service::Payment, "GATEWAY_TIMEOUT_MS".into(), "1000".into()));
    let deadline = cfg.deadline.as_secs().to_string();
    for var in [
        "SAGA_DEADLINE_PENDING_SECS",
        "SAGA_DEADLINE_AWAITING_PAYMENT_SECS",
        "SAGA_DEADLINE_REFUNDING_SECS",
        "SAGA_DEADLINE_CANCELLING_SECS",
    ] {
        opts.extra_env.push((Service::OrderApi, var.into(), deadline.clone()));
    }
    opts.extra_env
        .push((Service::Payment, "PAYMENT_PENDING_DEADLINE_SECS".into(), deadline));
    if cfg.negative_control {
        opts.extra_env
            .push((Service::Payment, "UNSAFE_PAYMENT_NO_DEDUP".into(), "true".into()));
    }
    if let Some(layer) = cfg.layer_off {
        let (services, var) = layer.env();
        for service in services {
            opts.extra_env.push((service, var.into(), "true".into()));
        }
    }
    let run_dir = opts.run_dir.clone();
    if cfg.progress {
        eprintln!(
            "chaos: seed {} · {}{} orders · logs in {}",
            cfg.seed,
            cfg.orders,
            if cfg.max_orders > cfg.orders { "+" } else { "" },
            run_dir.display()
        );
    }
    let mut stack = Stack::start(opts).await?;
    let result = drive::drive(&mut stack, cfg).await;
    if let Ok(report) = &result {
        let json = serde_json::to_vec_pretty(report)?;
        let md = markdown(report);
        for dir in std::iter::once(run_dir.clone()).chain(cfg.report_dir.clone()) {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("report.json"), &json)?;
            std::fs::write(dir.join("report.md"), &md)?;
            std::fs::write(dir.join("report.svg"), svg(report))?;
        }
    }
    // Keep the logs (and the report) of a run that went wrong.
    let keep = match &result {
        Err(_) => true,
        Ok(r) => !cfg.negative_control && cfg.layer_off.is_none() && !r.passed(),
    };
    if keep && cfg.progress {
        eprintln!("chaos: logs and report kept in {}", run_dir.display());
    }
    stack.shutdown(!keep).await?;
    result
}
