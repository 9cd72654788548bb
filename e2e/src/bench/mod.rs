//! `cargo xtask bench`: the saga's throughput and latency on one fresh
//! stack, each figure beside the ceiling it is bounded by.
//!
//! 1. [`ceilings`]: the broker alone (produce + consume with the services'
//!    client settings, as orders per second) and the database alone (the
//!    create transaction and a consumer's inbox + effect transaction);
//! 2. after a warm-up ([`load::warm_up`]), the highest arrival rate the saga
//!    sustains without a growing backlog (open loop), with CPU per order;
//! 3. placed → terminal latency at half that rate, from each intended send;
//! 4. the drain rate of a burst at three times that rate;
//! 5. `POST /orders` alone, closed loop;
//! 6. with `--instances N` ([`scale`]), each consumer service runs as N
//!    instances in its group, and the events each one applied are reported.

pub mod ceilings;
pub mod load;
pub mod pg_settings;
pub mod scale;
pub mod trace_cost;

pub use load::{Latency, Stage};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::driver::Client;
use crate::stack::Stack;

/// How to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Length of a sustained-rate trial.
    pub window: Duration,
    /// First arrival rate tried, orders per second.
    pub start_rate: f64,
    /// Sustained-rate trials at most.
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
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            start_rate: 100.0,
            trials: 6,
            broker_messages: 20_000,
            tight_loop: Duration::from_secs(5),
            latency_window: Duration::from_secs(30),
            burst: Duration::from_secs(10),
            quick: false,
            instances: 1,
            postgres_settings: Vec::new(),
        }
    }
}

/// One sustained-rate trial.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// Arrival rate, orders per second.
    pub rate: f64,
    /// Orders acknowledged.
    pub placed: usize,
    /// Requests refused or failed.
    pub failed: usize,
    /// Backlog (orders not terminal) at mid-window and at the end.
    pub backlog_mid: i64,
    /// Backlog at the end of the window.
    pub backlog_end: i64,
    /// Backlog growth: mean of the last quarter of the window minus mean of
    /// the second quarter.
    pub backlog_growth: f64,
    /// Sustained: every order sent within [`load::MAX_SEND_LAG`], none
    /// failed, the backlog grew by at most half a second of arrivals (or 20)
    /// from the second to the last quarter of the window, and it drained.
    pub sustained: bool,
    /// Orders sent per second (all, over the time to send the last).
    pub offered_per_sec: f64,
    /// How late the most delayed order was sent, in seconds.
    pub send_lag_secs: f64,
    /// The backlog, second by second.
    pub backlog: Vec<i64>,
    /// CPU milliseconds per order, per process (over the window).
    pub cpu_ms_per_order: BTreeMap<String, f64>,
    /// Seconds to drain after the window (`None`: did not drain within the limit).
    pub drain_secs: Option<f64>,
    /// PostgreSQL per order over the window and its drain: WAL bytes and
    /// commits (every committed transaction in the four databases,
    /// read-only ones included: the services' gauges and the driver's polls).
    pub postgres_per_order: PgPerOrder,
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
struct PgCounters {
    wal_lsn: i64,
    commits: i64,
}

impl PgCounters {
    async fn read(stack: &Stack) -> anyhow::Result<Self> {
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

    fn per_order(self, after: Self, orders: usize) -> PgPerOrder {
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
}

/// Every figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// When, RFC 3339.
    pub date: String,
    /// The machine, in words.
    pub machine: String,
    /// The broker alone.
    pub broker: ceilings::BrokerCeiling,
    /// The database alone.
    pub database: ceilings::DatabaseCeiling,
    /// Every sustained-rate trial, in order.
    pub trials: Vec<Trial>,
    /// The highest sustained rate found (0 when none was).
    pub sustained_rate: f64,
    /// That rate over the broker-derived ceiling.
    pub sustained_vs_broker: f64,
    /// That rate over the database-derived ceiling.
    pub sustained_vs_database: f64,
    /// Latency at half the sustained rate.
    pub latency: Option<Latency>,
    /// Burst at three times the sustained rate.
    pub burst: Option<Burst>,
    /// `POST /orders` alone.
    pub http: load::HttpFigures,
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
const PROCESSES: [(&str, &str); 8] = [
    ("order-api", "order-api"),
    ("outbox-relay", "outbox-relay"),
    ("inventory-servi", "inventory-service"),
    ("payment-service", "payment-service"),
    ("mock-gateway", "mock-gateway"),
    ("java", "kafka (JVM)"),
    ("postgres", "postgres"),
    ("xtask", "driver (xtask)"),
];

fn cpu_per_order(
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

async fn trial(stack: &Stack, client: &Client, rate: f64, window: Duration) -> anyhow::Result<Trial> {
    let orders_db = &stack.db_url("orders");
    let pg_before = PgCounters::read(stack).await?;
    let before = testkit::process::cpu_seconds_by_command();
    let sent = load::open_loop(client, orders_db, rate, window).await?;
    let after = testkit::process::cpu_seconds_by_command();
    let b = &sent.backlog;
    let backlog_end = *b.last().unwrap_or(&0);
    let backlog_mid = b.get(b.len() / 2).copied().unwrap_or(0);
    let quarter = |q: usize| {
        let part = &b[(b.len() * q / 4).min(b.len())..(b.len() * (q + 1) / 4).min(b.len())];
        part.iter().sum::<i64>() as f64 / part.len().max(1) as f64
    };
    let backlog_growth = quarter(3) - quarter(1);
    let drain = load::wait_drained(orders_db, Duration::from_secs(180)).await?;
    let pg_after = PgCounters::read(stack).await?;
    let kept_up = backlog_growth <= (0.5 * rate).max(20.0) && drain.is_some();
    let sustained = sent.on_time() && sent.failed == 0 && kept_up;
    Ok(Trial {
        rate,
        placed: sent.intended.len(),
        failed: sent.failed,
        backlog_mid,
        backlog_end,
        backlog_growth,
        sustained,
        offered_per_sec: sent.offered_per_sec,
        send_lag_secs: sent.send_lag.as_secs_f64(),
        backlog: sent.backlog.clone(),
        cpu_ms_per_order: cpu_per_order(&before, &after, sent.intended.len()),
        drain_secs: drain.map(|d| d.as_secs_f64()),
        postgres_per_order: pg_before.per_order(pg_after, sent.intended.len()),
    })
}

/// Searches the highest sustained rate: up by half while trials pass, then
/// halfway between the best pass and the lowest failure.
async fn search(stack: &Stack, client: &Client, cfg: &BenchConfig) -> anyhow::Result<(Vec<Trial>, f64)> {
    let (mut trials, mut best, mut failed_at) = (Vec::new(), 0.0f64, f64::INFINITY);
    let mut rate = cfg.start_rate;
    for _ in 0..cfg.trials {
        eprintln!("bench: sustained trial at {rate:.0} orders/s for {:?}", cfg.window);
        let t = trial(stack, client, rate, cfg.window).await?;
        eprintln!(
            "bench:   placed {} (offered {:.0}/s, latest send {:.1} s late) failed {} backlog mid {} end {} growth {:.0} → {}",
            t.placed,
            t.offered_per_sec,
            t.send_lag_secs,
            t.failed,
            t.backlog_mid,
            t.backlog_end,
            t.backlog_growth,
            if t.sustained { "sustained" } else { "not sustained" }
        );
        let drained = t.drain_secs.is_some();
        if t.sustained {
            best = best.max(rate);
        } else {
            failed_at = failed_at.min(rate);
        }
        trials.push(t);
        if !drained {
            eprintln!("bench: the backlog did not drain; stopping the search");
            break;
        }
        rate = if failed_at.is_finite() {
            if best == 0.0 {
                rate * 0.5
            } else {
                (best + failed_at) / 2.0
            }
        } else {
            rate * 1.5
        };
        if best > 0.0 && failed_at.is_finite() && (failed_at - best) / best < 0.1 {
            break;
        }
    }
    Ok((trials, best))
}

async fn burst(client: &Client, orders_db: &str, rate: f64, window: Duration) -> anyhow::Result<Burst> {
    eprintln!("bench: burst at {rate:.0} orders/s for {window:?}");
    let start = SystemTime::now();
    let clock = Instant::now();
    let sent = load::open_loop(client, orders_db, rate, window).await?;
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
        drain_per_sec: lat.len() as f64 / total,
        total_secs: total,
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
    client.seed_stock("WIDGET", 2_000_000_000).await?;
    let idle_cores = idle().await;
    let orders_db = stack.db_url("orders");
    eprintln!("bench: broker ceiling ({} messages)", cfg.broker_messages);
    let broker = ceilings::broker(&stack.kafka(), cfg.broker_messages).await?;
    eprintln!("bench: database ceiling ({:?} per loop)", cfg.tight_loop);
    let database = ceilings::database(8, cfg.tight_loop).await?;
    load::warm_up(&client, &orders_db, cfg.start_rate).await?;
    let (trials, sustained) = search(stack, &client, cfg).await?;
    let (latency, burst) = if sustained > 0.0 && !cfg.quick {
        (
            Some(load::latency(&client, &orders_db, sustained / 2.0, cfg.latency_window).await?),
            Some(burst(&client, &orders_db, sustained * 3.0, cfg.burst).await?),
        )
    } else {
        (None, None)
    };
    eprintln!("bench: POST /orders, closed loop");
    let http = load::post_max(
        &client,
        32,
        if cfg.quick {
            cfg.tight_loop / 5
        } else {
            cfg.tight_loop * 2
        },
    )
    .await?;
    scale::count(&mut instances).await;
    Ok(Figures {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        machine: machine(),
        sustained_vs_broker: sustained / broker.orders_per_sec,
        sustained_vs_database: sustained / database.orders_per_sec,
        broker,
        database,
        trials,
        sustained_rate: sustained,
        latency,
        burst,
        http,
        instances_per_service: cfg.instances.max(1),
        instances,
        postgres_settings: cfg.postgres_settings.iter().map(|(n, v)| format!("{n}={v}")).collect(),
        idle_cores,
    })
}

/// The figures as a markdown report.
pub fn markdown(f: &Figures) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Saga throughput and latency — {}\n\n{}\n", f.date, f.machine);
    if !f.postgres_settings.is_empty() {
        let _ = writeln!(
            s,
            "PostgreSQL settings for this run: `{}`\n",
            f.postgres_settings.join("`, `")
        );
    }
    let _ = writeln!(s, "| figure | value | ceiling | ratio |\n|---|---:|---:|---:|");
    let _ = writeln!(
        s,
        "| broker alone: messages/s (produce + consume, {} B) | {:.0} | | |",
        f.broker.message_bytes, f.broker.messages_per_sec
    );
    let _ = writeln!(
        s,
        "| broker alone as orders/s (4 messages each) | {:.0} | | |",
        f.broker.orders_per_sec
    );
    let _ = writeln!(
        s,
        "| database alone: create tx/s, consumer tx/s ({} clients) | {:.0}, {:.0} | | |",
        f.database.clients, f.database.create_tx_per_sec, f.database.consumer_tx_per_sec
    );
    let _ = writeln!(
        s,
        "| database alone as orders/s | {:.0} | | |",
        f.database.orders_per_sec
    );
    let _ = writeln!(
        s,
        "| **sustained end to end, orders/s** | **{:.0}** | {:.0} (broker) / {:.0} (database) | {:.0} % / {:.0} % |",
        f.sustained_rate,
        f.broker.orders_per_sec,
        f.database.orders_per_sec,
        f.sustained_vs_broker * 100.0,
        f.sustained_vs_database * 100.0
    );
    if let Some(l) = &f.latency {
        let _ = writeln!(
            s,
            "| placed → terminal at {:.0}/s: p50 / p99 ms | {:.0} / {:.0} | | |",
            l.rate, l.p50_ms, l.p99_ms
        );
        for stage in &l.stages {
            let _ = writeln!(
                s,
                "| … {}: p50 / p99 ms | {:.0} / {:.0} | | |",
                stage.name, stage.p50_ms, stage.p99_ms
            );
        }
    }
    if let Some(b) = &f.burst {
        let _ = writeln!(
            s,
            "| burst {:.0}/s × {} orders: drain orders/s (peak backlog) | {:.0} ({}) | {:.0} (broker) | {:.0} % |",
            b.rate,
            b.placed,
            b.drain_per_sec,
            b.peak_backlog,
            f.broker.orders_per_sec,
            b.drain_per_sec / f.broker.orders_per_sec * 100.0
        );
    }
    let _ = writeln!(
        s,
        "| POST /orders alone ({} clients): req/s, p50 / p99 ms | {:.0}, {:.1} / {:.1} | {:.0} (create tx/s) | {:.0} % |",
        f.http.clients,
        f.http.requests_per_sec,
        f.http.p50_ms,
        f.http.p99_ms,
        f.database.create_tx_per_sec,
        f.http.requests_per_sec / f.database.create_tx_per_sec * 100.0
    );
    let _ = writeln!(s, "\n## Sustained-rate trials\n");
    let _ = writeln!(
        s,
        "| rate | placed | offered /s (latest send late, s) | failed | backlog mid → end (growth) | sustained | drain s | WAL kB / order | commits / order |\n|---:|---:|---:|---:|---|---|---:|---:|---:|"
    );
    for t in &f.trials {
        let _ = writeln!(
            s,
            "| {:.0} | {} | {:.0} ({:.1}) | {} | {} → {} ({:+.0}) | {} | {} | {:.1} | {:.1} |",
            t.rate,
            t.placed,
            t.offered_per_sec,
            t.send_lag_secs,
            t.failed,
            t.backlog_mid,
            t.backlog_end,
            t.backlog_growth,
            if t.sustained { "yes" } else { "no" },
            t.drain_secs.map_or("—".into(), |d| format!("{d:.1}")),
            t.postgres_per_order.wal_bytes / 1024.0,
            t.postgres_per_order.commits
        );
    }
    let _ = writeln!(
        s,
        "\n## Consumer instances ({} per service): events applied over the run\n",
        f.instances_per_service
    );
    let _ = writeln!(
        s,
        "| service | instance | partitions | applied | duplicates absorbed |\n|---|---|---:|---:|---:|"
    );
    for i in &f.instances {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.0} |",
            i.service,
            i.url,
            i.partitions,
            i.applied.max(0.0),
            i.duplicates.max(0.0)
        );
    }
    if let Some(best) = f
        .trials
        .iter()
        .filter(|t| t.sustained)
        .max_by(|a, b| a.rate.total_cmp(&b.rate))
    {
        let _ = writeln!(s, "\n## CPU per order at {:.0} orders/s (ms)\n", best.rate);
        let _ = writeln!(
            s,
            "Idle: cores the process uses with no orders. Above idle: ms per order beyond that fixed cost.\n"
        );
        let _ = writeln!(
            s,
            "| process | ms / order | idle, cores | above idle, ms / order |\n|---|---:|---:|---:|"
        );
        let above = |p: &str, ms: f64| ms - f.idle_cores.get(p).unwrap_or(&0.0) * 1000.0 / best.rate;
        for (p, ms) in &best.cpu_ms_per_order {
            let idle = f.idle_cores.get(p).unwrap_or(&0.0);
            let _ = writeln!(s, "| {p} | {ms:.2} | {idle:.3} | {:.2} |", above(p, *ms));
        }
        let total: f64 = best.cpu_ms_per_order.values().sum();
        let idle: f64 = f.idle_cores.values().sum();
        let _ = writeln!(
            s,
            "| **total** | **{total:.2}** | **{idle:.3}** | **{:.2}** |",
            total - idle * 1000.0 / best.rate
        );
    }
    s
}
