//! The phases of a run: seed stock, start the clients and the sampler, run
//! the fault schedule, stop the faults and let the system drain, audit.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use sqlx::Connection;

use super::clients::{Acked, ClientStats, Clients};
use super::faults::{self, Fault, Schedule};
use super::plan::{self, Kind};
use super::report::{self, Report, Sample};
use super::ChaosConfig;
use crate::driver::Client;
use crate::invariants::{audit, Expected};
use crate::stack::{Service, Stack};

/// Stock per SKU at the start: plenty of WIDGET and GADGET, 5 RARE (so the
/// out-of-stock orders, 4 RARE each, mostly fail).
fn initial_stock(orders: usize) -> [(&'static str, i32); 3] {
    [
        ("WIDGET", (orders * 3) as i32),
        ("GADGET", (orders * 3) as i32),
        ("RARE", 5),
    ]
}

/// Runs one chaos run on `stack` and reports it.
pub(super) async fn drive(stack: &mut Stack, cfg: &ChaosConfig) -> anyhow::Result<Report> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let client = Client::new(stack, Duration::from_secs(2))?;
    let stock = initial_stock(cfg.orders);
    for (sku, n) in stock {
        client.seed_stock(sku, n).await?;
    }
    let plan = plan::plan(&mut rng, cfg.orders);

    let started = Instant::now();
    let started_at = chrono::Utc::now();
    let clients = Clients::start(&client, plan, cfg.clients, cfg.rate_per_sec, started);
    let sampler = Sampler::start(stack.db_url("orders"), clients.acked.clone(), cfg);
    let schedule = faults::run_schedule(stack, &client, &mut rng, cfg, started, &clients).await?;
    let (acked, stats) = clients.finish().await?;
    let load_ms = started.elapsed().as_millis() as u64;

    let calm = Instant::now();
    let drained = calm_down(stack, &client, cfg.quiesce_timeout).await;
    let quiesce_ms = calm.elapsed().as_millis() as u64;
    let samples = sampler.stop().await?;

    let expected = Expected {
        initial_stock: stock.iter().map(|(s, n)| ((*s).to_owned(), i64::from(*n))).collect(),
        acknowledged: acked.iter().map(|(k, (id, _))| (k.clone(), *id)).collect(),
        indeterminate: stats.indeterminate,
        rescue_expected: Default::default(),
    };
    let run = Run {
        schedule,
        acked,
        stats,
        samples,
        started_at,
        drained,
        load_ms,
        quiesce_ms,
    };
    verdict(stack, cfg, &expected, run).await
}

/// Stops the faults, starts whatever is down without crash points, and
/// waits for the system to drain.
async fn calm_down(stack: &mut Stack, client: &Client, timeout: Duration) -> anyhow::Result<()> {
    faults::end_windows(stack, client).await;
    for s in Service::ALL {
        stack.disarm(s);
        if !stack.is_running(s) {
            stack.start_service(s).await?;
        }
    }
    wait_drained(stack, timeout).await
}

/// A per-second sample of progress, taken in the background.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(orders_url: String, acked: Acked, cfg: &ChaosConfig) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (progress, total, flag) = (cfg.progress, cfg.orders, stop.clone());
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let t0 = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let in_flight = non_terminal(&orders_url).await.unwrap_or(-1);
                let acknowledged = acked.lock().expect("acked").len();
                let second = t0.elapsed().as_secs();
                if progress && second.is_multiple_of(5) {
                    eprintln!("chaos: t={second:>3}s acknowledged {acknowledged}/{total} · not terminal {in_flight}");
                }
                samples.push(Sample {
                    second,
                    acknowledged,
                    in_flight,
                });
            }
            samples
        });
        Self { stop, task }
    }

    async fn stop(self) -> anyhow::Result<Vec<Sample>> {
        self.stop.store(true, Ordering::SeqCst);
        Ok(self.task.await?)
    }
}

/// What the load phase left for the audit.
struct Run {
    schedule: Schedule,
    acked: BTreeMap<String, (uuid::Uuid, Kind)>,
    stats: ClientStats,
    samples: Vec<Sample>,
    started_at: chrono::DateTime<chrono::Utc>,
    drained: anyhow::Result<()>,
    load_ms: u64,
    quiesce_ms: u64,
}

/// Audits the drained system and decides whether the run counts and passed.
async fn verdict(stack: &Stack, cfg: &ChaosConfig, expected: &Expected, run: Run) -> anyhow::Result<Report> {
    let Schedule {
        timeline,
        crash_points,
        mut duplicates,
        placing_ms,
    } = run.schedule;
    let (acked, stats) = (run.acked, run.stats);
    let audit = audit(stack, expected).await?;
    let mut problems = audit.violations.clone();
    // Reading the whole log back can time out on a slow broker; try again
    // before giving up, and then say so rather than lose the report.
    let mut counted = Err(anyhow::anyhow!("not tried"));
    for _ in 0..3 {
        counted = report::count_duplicates(stack, &mut duplicates).await;
        if counted.is_ok() {
            break;
        }
    }
    if let Err(e) = counted {
        problems.push(format!("could not read the topics back to count duplicates: {e}"));
    }
    let outcomes = report::outcomes(stack, &acked).await?;

    let mut kills: BTreeMap<String, u32> = stack.kills.iter().map(|(s, n)| (s.name().to_owned(), *n)).collect();
    for (point, n) in &crash_points {
        let service = point.split("::").next().unwrap_or(point).to_owned();
        *kills.entry(format!("{service} (crash point)")).or_default() += n;
    }
    let mut faults_fired: BTreeMap<String, u32> = BTreeMap::new();
    for e in timeline.iter().filter(|e| e.fired) {
        *faults_fired.entry(format!("{:?}", e.fault)).or_default() += 1;
    }

    problems.extend(stats.violations.iter().cloned());
    if let Err(e) = &run.drained {
        problems.push(format!("did not drain: {e}"));
    }
    if faults_fired.len() < Fault::FIRST_ROUND.len() {
        problems.push(format!(
            "only {} of {} fault kinds fired",
            faults_fired.len(),
            Fault::FIRST_ROUND.len()
        ));
    }
    if duplicates.delivered() == 0 {
        problems.push("no duplicates were delivered: the run proves nothing".into());
    }
    // Every duplicate copy in the log reached its consumer and was absorbed
    // (the inboxes also count redeliveries the log does not show: offsets
    // not committed before a crash, a second instance reading the same partitions).
    // Per consumer: every duplicate copy on its topic reached it and was
    // absorbed by its own inbox (which also counts redeliveries the log does
    // not show: offsets not committed before a crash, a second instance).
    for c in contract::topics::consumers::ALL {
        let in_log = duplicates.in_log.get(c.topic).copied().unwrap_or(0) as i64;
        let absorbed = duplicates.absorbed.get(c.name).copied().unwrap_or(0);
        if absorbed < in_log {
            problems.push(format!(
                "{}: {in_log} duplicate copies on {} but only {absorbed} absorbed by {}'s inbox",
                crate::invariants::STEP_ONCE,
                c.topic,
                c.name
            ));
        }
    }
    let placed_per_sec = stats.acknowledged as f64 * 1000.0 / placing_ms.max(1) as f64;
    let offered_per_sec = cfg.orders as f64 * 1000.0 / stats.last_first_send_ms.max(1) as f64;
    Ok(Report {
        seed: cfg.seed,
        orders: cfg.orders,
        negative_control: cfg.negative_control,
        layer_off: cfg.layer_off,
        outcomes,
        clients: stats,
        kills,
        crash_points,
        faults_fired,
        timeline,
        samples: run.samples,
        started_at: run.started_at,
        duplicates,
        quiesce_ms: run.quiesce_ms,
        load_ms: run.load_ms,
        rate_per_sec: cfg.rate_per_sec,
        clients_n: cfg.clients,
        fault_interval_ms: cfg.fault_interval.as_millis() as u64,
        placed_per_sec,
        offered_per_sec,
        audit,
        problems,
    })
}

async fn non_terminal(orders_url: &str) -> anyhow::Result<i64> {
    let mut c = sqlx::PgConnection::connect(orders_url).await?;
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE status NOT IN ('CONFIRMED', 'CANCELLED')")
            .fetch_one(&mut c)
            .await?,
    )
}

/// Waits until no order is mid-saga, every outbox is drained and every
/// consumer group has committed the end of its topic (so every duplicate
/// copy in the log has reached its consumer before the audit counts them).
async fn wait_drained(stack: &Stack, timeout: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + timeout;
    loop {
        let busy = non_terminal(&stack.db_url("orders")).await.unwrap_or(i64::MAX);
        let mut pending = 0i64;
        for db in ["orders", "inventory", "payments"] {
            if let Ok(mut c) = sqlx::PgConnection::connect(&stack.db_url(db)).await {
                pending += sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL",
                )
                .fetch_one(&mut c)
                .await
                .unwrap_or(i64::MAX / 4);
            }
        }
        let lag = if busy == 0 && pending == 0 {
            consumers_lag(stack).await
        } else {
            i64::MAX
        };
        if busy == 0 && pending == 0 && lag == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "{busy} orders mid-saga, {pending} outbox rows pending, consumers {lag} messages behind after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Messages the saga's consumer groups have not committed yet, all topics together.
async fn consumers_lag(stack: &Stack) -> i64 {
    let brokers = stack.brokers();
    tokio::task::spawn_blocking(move || {
        contract::topics::consumers::ALL
            .iter()
            .map(|c| kafka::group_lag(&brokers, c.name, c.topic, Duration::from_secs(5)).unwrap_or(i64::MAX / 4))
            .sum()
    })
    .await
    .unwrap_or(i64::MAX)
}
