//! `cargo xtask bench`: the saga's capacity and latency on one fresh
//! stack, each figure beside the ceiling it is bounded by and the floor
//! of one order.
//!
//! 1. the tables prefilled ([`prefill`]) and the orders of a mix ([`mix`]);
//! 2. after a warm-up ([`load::warm_up`]), the ceilings of the warm broker
//!    and of the database with the services' batch sizes ([`ceilings`]),
//!    the floor of one order and the intake alone ([`floor`]);
//! 3. the capacity search ([`search`]): up by half, then bisection to
//!    ± 5 %, the two decisive rates repeated three times;
//! 4. latency at the sustained rate (its trials) and at half of it;
//! 5. a burst at three times it: drain, latency, failures;
//! 6. with `--instances N` ([`scale`]), each consumer service runs as N
//!    instances in its group, and the events each one applied are reported.

pub mod ceilings;
pub mod floor;
pub mod load;
pub mod mix;
pub mod overload;
pub mod pg_cpu;
pub mod pg_profile;
pub mod pg_settings;
pub mod prefill;
pub mod queues;
mod report;
pub mod scale;
pub mod search;
pub mod trace_cost;

pub use load::{Latency, Percentiles, Stage};
pub use report::markdown;
pub use search::Trial;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::driver::Client;
use crate::stack::Stack;
use mix::{Load, Mix};

/// How to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Length of a sustained-rate trial.
    pub window: Duration,
    /// First arrival rate tried, orders per second.
    pub start_rate: f64,
    /// Trials of the capacity search at most.
    pub trials: usize,
    /// Messages for the broker ceiling.
    pub broker_messages: usize,
    /// Length of each database loop and of the HTTP run.
    pub tight_loop: Duration,
    /// Length of the latency run at half the sustained rate.
    pub latency_window: Duration,
    /// Length of the burst.
    pub burst: Duration,
    /// Only the ceilings and the sustained-rate search (for trying settings).
    pub quick: bool,
    /// Instances of each consumer service ([`scale::scale_out`]).
    pub instances: usize,
    /// PostgreSQL settings applied for the run ([`pg_settings`]), `name=value`.
    pub postgres_settings: Vec<(String, String)>,
    /// The orders sent.
    pub mix: Mix,
    /// Tables filled before the run (`None`: empty tables).
    pub prefill: Option<prefill::Prefill>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            start_rate: 100.0,
            trials: 20,
            broker_messages: 200_000,
            tight_loop: Duration::from_secs(10),
            latency_window: Duration::from_secs(60),
            burst: Duration::from_secs(10),
            quick: false,
            instances: 1,
            postgres_settings: Vec::new(),
            mix: Mix::realistic(),
            prefill: None,
        }
    }
}

/// What PostgreSQL wrote and committed per order (its WAL position and commit count read around a trial).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PgPerOrder {
    /// WAL bytes (the whole cluster: nothing else runs during a bench).
    pub wal_bytes: f64,
    /// Transactions committed, all four databases.
    pub commits: f64,
}

/// The cluster's WAL position and the four databases' commit count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PgCounters {
    wal_lsn: i64,
    commits: i64,
}

impl PgCounters {
    pub(crate) async fn read(stack: &Stack) -> anyhow::Result<Self> {
        use sqlx::Connection as _;
        let dbs: Vec<String> = ["orders", "inventory", "payments", "gateway"]
            .iter()
            .map(|d| stack.db_url(d).rsplit('/').next().unwrap_or_default().to_owned())
            .collect();
        let mut db = sqlx::PgConnection::connect(&stack.db_url("orders")).await?;
        // Backends publish their counters at most once a second.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let (wal_lsn, commits): (i64, i64) = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
                    (SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database WHERE datname = ANY($1))",
        )
        .bind(&dbs)
        .fetch_one(&mut db)
        .await?;
        db.close().await?;
        Ok(Self { wal_lsn, commits })
    }

    pub(crate) fn per_order(self, after: Self, orders: usize) -> PgPerOrder {
        let n = orders.max(1) as f64;
        PgPerOrder {
            wal_bytes: (after.wal_lsn - self.wal_lsn) as f64 / n,
            commits: (after.commits - self.commits) as f64 / n,
        }
    }
}

/// A burst and its drain.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    /// Arrival rate during the burst.
    pub rate: f64,
    /// Orders placed.
    pub placed: usize,
    /// Largest backlog seen.
    pub peak_backlog: i64,
    /// Orders per second from the burst's start to the last order's end.
    pub drain_per_sec: f64,
    /// Seconds from the burst's start until every order was terminal.
    pub total_secs: f64,
    /// Placed → terminal from each intended send, orders not cancelled.
    pub latency: Percentiles,
    /// Requests that did not get a 201.
    pub failed: usize,
    /// How late the most delayed order was sent, seconds.
    pub send_lag_secs: f64,
}

/// The PostgreSQL server the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Postgres {
    /// `SELECT version()`.
    pub version: String,
    /// Every setting not at its built-in default (`name=value`, from
    /// `pg_settings` where the source is a file, ALTER SYSTEM or the command line).
    pub settings: Vec<String>,
    /// How the services reached it (`unix socket <dir>` or `tcp <host:port>`).
    pub transport: String,
    /// Whether a connection as the services make them ran over TLS.
    pub tls: bool,
}

impl Postgres {
    async fn read(url: &str, transport: String) -> anyhow::Result<Self> {
        use sqlx::Connection as _;
        let mut db = sqlx::PgConnection::connect(url).await?;
        let version: String = sqlx::query_scalar("SELECT version()").fetch_one(&mut db).await?;
        let tls: bool =
            sqlx::query_scalar("SELECT coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)")
                .fetch_one(&mut db)
                .await?;
        let settings: Vec<String> = sqlx::query_scalar(
            "SELECT name || '=' || setting || coalesce(unit, '') FROM pg_settings
             WHERE source NOT IN ('default', 'override', 'client', 'session') ORDER BY name",
        )
        .fetch_all(&mut db)
        .await?;
        db.close().await?;
        Ok(Self {
            version,
            settings,
            transport,
            tls,
        })
    }
}

/// Every figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// When, RFC 3339.
    pub date: String,
    /// The machine, in words.
    pub machine: String,
    /// Kafka nodes; topics' replication factor and min ISR follow (1/1 or 3/2).
    pub kafka_nodes: u32,
    /// Partitions per topic.
    pub partitions: i32,
    /// The orders sent.
    pub mix: Mix,
    /// The tables filled before the run.
    pub prefilled: Vec<prefill::Filled>,
    /// PostgreSQL's version and settings.
    pub postgres: Postgres,
    /// The broker alone, warm.
    pub broker: ceilings::BrokerCeiling,
    /// The database alone.
    pub database: ceilings::DatabaseCeiling,
    /// The floor of one order.
    pub floor: floor::Floor,
    /// `POST /orders` with nothing downstream.
    pub intake: floor::Intake,
    /// Every trial of the search, in order.
    pub trials: Vec<Trial>,
    /// Each rate's verdict from its trials.
    pub verdicts: Vec<search::Verdict>,
    /// The highest sustained rate found (0 when none was).
    pub sustained_rate: f64,
    /// The lowest rate above it that did not hold (infinite: none found).
    pub failed_rate: f64,
    /// Latency at half the sustained rate.
    pub latency: Option<Latency>,
    /// Burst at three times the sustained rate.
    pub burst: Option<Burst>,
    /// Instances per consumer service.
    pub instances_per_service: usize,
    /// Every consumer instance and what it handled over the whole run.
    pub instances: Vec<scale::Instance>,
    /// PostgreSQL settings applied for the run (`name=value`; none: the server's own).
    pub postgres_settings: Vec<String>,
    /// Cores each process uses with the stack up and no orders (over
    /// [`IDLE_WINDOW`], before any load): the fixed cost every rate pays.
    pub idle_cores: BTreeMap<String, f64>,
}

impl Figures {
    /// The sustained rate's trial with the median p99: the latency and CPU
    /// reported at the sustained rate.
    pub fn sustained_trial(&self) -> Option<&Trial> {
        let mut at: Vec<&Trial> = self
            .trials
            .iter()
            .filter(|t| t.rate == self.sustained_rate && t.sustained)
            .collect();
        at.sort_by(|a, b| a.latency.p99_ms.total_cmp(&b.latency.p99_ms));
        at.get(at.len() / 2).copied()
    }
}

/// How long the idle stack's CPU is measured.
pub const IDLE_WINDOW: Duration = Duration::from_secs(20);

/// Cores each process of [`PROCESSES`] uses over [`IDLE_WINDOW`] with no orders.
async fn idle() -> BTreeMap<String, f64> {
    eprintln!("bench: idle stack for {IDLE_WINDOW:?}");
    let before = testkit::process::cpu_seconds_by_command();
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = testkit::process::cpu_seconds_by_command();
    // CPU ms per "order" over a window of IDLE_WINDOW seconds, one order: ms used.
    cpu_per_order(&before, &after, 1)
        .into_iter()
        .map(|(p, ms)| (p, ms / 1000.0 / IDLE_WINDOW.as_secs_f64()))
        .collect()
}

/// The value at quantile `q` of `sorted` (0 when empty).
pub fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// The machine's cores.
pub fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} cores ({model}); broker, PostgreSQL, five services and the driver on it")
}

/// The processes whose CPU is reported, by command name.
pub const PROCESSES: [(&str, &str); 8] = [
    ("order-api", "order-api"),
    ("outbox-relay", "outbox-relay"),
    ("inventory-servi", "inventory-service"),
    ("payment-service", "payment-service"),
    ("mock-gateway", "mock-gateway"),
    ("java", "kafka (JVM)"),
    ("postgres", "postgres"),
    ("xtask", "driver (xtask)"),
];

pub(crate) fn cpu_per_order(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    orders: usize,
) -> BTreeMap<String, f64> {
    PROCESSES
        .iter()
        .map(|(comm, label)| {
            let used = after.get(*comm).unwrap_or(&0.0) - before.get(*comm).unwrap_or(&0.0);
            ((*label).to_owned(), used * 1000.0 / orders.max(1) as f64)
        })
        .collect()
}

async fn burst(load: &Load, orders_db: &str, rate: f64, window: Duration) -> anyhow::Result<Burst> {
    eprintln!("bench: burst at {rate:.0} orders/s for {window:?}");
    let start = SystemTime::now();
    let clock = Instant::now();
    let sent = load::open_loop(load, orders_db, rate, window).await?;
    load::wait_drained(orders_db, Duration::from_secs(300)).await?;
    let (lat, last) = load::latencies(orders_db, &sent).await?;
    let total = last
        .and_then(|l| l.duration_since(start).ok())
        .unwrap_or_else(|| clock.elapsed())
        .as_secs_f64();
    Ok(Burst {
        rate,
        placed: sent.intended.len(),
        peak_backlog: sent.backlog.iter().copied().max().unwrap_or(0),
        drain_per_sec: sent.intended.len() as f64 / total,
        total_secs: total,
        latency: Percentiles::of(&lat),
        failed: sent.failed,
        send_lag_secs: sent.send_lag.as_secs_f64(),
    })
}

/// Runs every measurement on `stack` (fresh, nothing else running on it),
/// with `cfg.instances` instances of each consumer service.
pub async fn run(stack: &mut Stack, cfg: &BenchConfig) -> anyhow::Result<Figures> {
    let settings = pg_settings::apply(&stack.db_url("orders"), &cfg.postgres_settings).await?;
    // Interrupted too, the settings are reset (then the caller drops the stack).
    let figures = crate::interrupt::unless_interrupted(measure(stack, cfg)).await;
    settings.reset().await?;
    figures
}

async fn measure(stack: &mut Stack, cfg: &BenchConfig) -> anyhow::Result<Figures> {
    let mut instances = scale::scale_out(stack, cfg.instances.max(1)).await?;
    let stack = &*stack;
    let client = Client::new(stack, Duration::from_secs(10))?;
    let orders_db = stack.db_url("orders");
    let postgres = Postgres::read(&orders_db, stack.postgres_transport()).await?;
    eprintln!("bench: {} SKUs seeded, {} API keys", cfg.mix.skus, cfg.mix.api_keys);
    let load = Load::prepare(stack, &client, cfg.mix.clone()).await?;
    // Before the prefill: its connections' CPU leaves with them, and
    // PostgreSQL's would read as negative.
    let idle_cores = idle().await;
    let prefilled = match &cfg.prefill {
        Some(p) => prefill::fill(stack, p).await?,
        None => Vec::new(),
    };
    load::warm_up(&load, &orders_db, cfg.start_rate).await?;
    eprintln!("bench: broker ceiling, warm ({} messages)", cfg.broker_messages);
    let broker = ceilings::broker(&stack.kafka(), cfg.broker_messages).await?;
    eprintln!("bench: database ceiling ({:?} per loop)", cfg.tight_loop);
    let partitions = usize::try_from(stack.options().partitions).unwrap_or(1);
    let database = ceilings::database(8, partitions, cfg.tight_loop).await?;
    eprintln!("bench: the floor of one order");
    let floor = floor::Floor::measure(stack, &broker, &database, cfg.tight_loop).await?;
    let intake = floor::intake(stack, &load, 32, cfg.tight_loop).await?;
    let (trials, sustained) = search::search(stack, &load, cfg.start_rate, cfg.window, cfg.trials).await?;
    let verdicts = search::verdicts(&trials);
    let (_, failed_rate) = search::bracket(&verdicts);
    let (latency, burst) = if sustained > 0.0 && !cfg.quick {
        (
            Some(load::latency(&load, &orders_db, sustained / 2.0, cfg.latency_window).await?),
            Some(burst(&load, &orders_db, sustained * 3.0, cfg.burst).await?),
        )
    } else {
        (None, None)
    };
    scale::count(&mut instances).await;
    Ok(Figures {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        machine: machine(),
        kafka_nodes: stack.options().brokers,
        partitions: stack.options().partitions,
        mix: cfg.mix.clone(),
        prefilled,
        postgres,
        broker,
        database,
        floor,
        intake,
        trials,
        verdicts,
        sustained_rate: sustained,
        failed_rate,
        latency,
        burst,
        instances_per_service: cfg.instances.max(1),
        instances,
        postgres_settings: cfg.postgres_settings.iter().map(|(n, v)| format!("{n}={v}")).collect(),
        idle_cores,
    })
}
