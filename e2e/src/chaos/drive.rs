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
use super::judge;
use super::plan::{self, Kind};
use super::report::{self, Report, Sample};
use super::ChaosConfig;
use crate::driver::Client;
use crate::invariants::{audit, Expected};
use crate::stack::{Service, Stack};

/// Stock per SKU at the start: plenty of WIDGET and GADGET, 3 RARE (so
/// every out-of-stock order, 4 RARE each, is refused: its outcome is known).
fn initial_stock(orders: usize) -> [(&'static str, i32); 3] {
    [
        ("WIDGET", (orders * 3) as i32),
        ("GADGET", (orders * 3) as i32),
        ("RARE", 3),
    ]
}

/// Runs one chaos run on `stack` and reports it.
pub(super) async fn drive(stack: &mut Stack, cfg: &ChaosConfig) -> anyhow::Result<Report> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let client = Client::new(stack, Duration::from_secs(2))?;
    let stock = initial_stock(cfg.orders.max(cfg.max_orders));
    for (sku, n) in stock {
        client.seed_stock(sku, n).await?;
    }
    let plan = plan::plan(&mut rng, cfg.orders.max(cfg.max_orders));

    let started = Instant::now();
    let started_at = chrono::Utc::now();
    let clients = Clients::start(&client, plan, cfg.orders, cfg.clients, cfg.rate_per_sec, started);
    let sampler = Sampler::start(stack.db_url("orders"), clients.acked.clone(), cfg);
    let schedule = faults::run_schedule(stack, &client, cfg, started, &clients).await?;
    let (acked, stats) = clients.finish().await?;
    let load_ms = started.elapsed().as_millis() as u64;
    let expected = Expected {
        initial_stock: stock.iter().map(|(s, n)| ((*s).to_owned(), i64::from(*n))).collect(),
        acknowledged: acked.iter().map(|(k, (id, _))| (k.clone(), *id)).collect(),
        indeterminate: stats.indeterminate,
        rescue_expected: Default::default(),
        // The audit reads the log back (provenance): which copy each inbox applied.
        resends_judged_by_the_log: true,
        amount_is_nonce: true,
    };

    let calm = Instant::now();
    let (drained, stopped_early) = calm_down(stack, &client, cfg, &expected).await;
    let quiesce_ms = calm.elapsed().as_millis() as u64;
    let samples = sampler.stop().await?;
    if stopped_early {
        // Nothing moves from here on: the verdict's look is the settled one.
        stack.interrupt_services().await;
    }
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
    let (mut report, first_look) = verdict(stack, cfg, &expected, run).await?;
    // The second look: with every service stopped nothing can move, so
    // what the audit saw must still be there.
    stack.interrupt_services().await;
    let after = audit(stack, &expected).await?;
    if after.violations != first_look
        || after.orders_by_status != report.audit.orders_by_status
        || (after.captures, after.refunds) != (report.audit.captures, report.audit.refunds)
    {
        report.problems.push(format!(
            "the audit after the services stopped differs from the one before: {:?} / {} captures, {} refunds; violations {:?}",
            after.orders_by_status, after.captures, after.refunds, after.violations
        ));
    }
    Ok(report)
}

/// Stops the faults, starts whatever is down without crash points, and
/// waits for the system to drain and then to stay quiet. A system that
/// stays quiet for the window (longer than every deadline, so no
/// reconciler is still due to act) with orders open will not drain: that
/// ends the wait at once, and the audit names the stuck orders.
///
/// A run with a layer off stops waiting at the first durable evidence of
/// the effect its layer guards (read from the databases and the log every
/// few seconds, as the verdict reads them): the wait for deadlines and a
/// quiet window would show nothing more. Returns whether it stopped so;
/// the caller then stops the services before the verdict's look.
async fn calm_down(
    stack: &mut Stack,
    client: &Client,
    cfg: &ChaosConfig,
    expected: &Expected,
) -> (anyhow::Result<()>, bool) {
    faults::end_windows(stack, client).await;
    for s in Service::ALL {
        stack.disarm(s);
        if !stack.is_running(s) {
            if let Err(e) = stack.start_service(s).await {
                return (Err(e), false);
            }
        }
    }
    let stack = &*stack;
    let settle = async {
        let (end, window) = (Instant::now() + cfg.quiesce_timeout, cfg.quiet_window());
        tokio::select! {
            drained = wait_drained(stack, cfg.quiesce_timeout) => drained?,
            still = wait_quiet(stack, window, end) => {
                still?;
                anyhow::bail!("nothing moved for {window:?} with the saga not drained: stuck");
            }
        }
        wait_quiet(stack, window, end).await
    };
    let Some(layer) = cfg.layer_off else {
        return (settle.await, false);
    };
    tokio::select! {
        settled = settle => (settled, false),
        () = first_evidence(stack, layer, expected) => (
            Err(anyhow::anyhow!("stopped at the first evidence of {} off, before draining", layer.name())),
            true,
        ),
    }
}

/// Returns once the audit and the log show the effect `layer` guards in
/// two looks in a row, five seconds apart: durable, not a batch caught
/// half-way (with the inbox committed apart, every batch in flight shows an
/// inbox row without its effect for a moment).
async fn first_evidence(stack: &Stack, layer: super::LayerOff, expected: &Expected) {
    let mut seen_before = false;
    loop {
        let mut seen = false;
        if let Ok(mut a) = audit(stack, expected).await {
            let mut scratch = super::Duplicates::default();
            if let Ok(log) = report::count_duplicates(stack, &mut scratch).await {
                judge::log_checks(stack, &log, &mut a).await;
            }
            seen = layer.caught_in(&a);
        }
        if seen && seen_before {
            return;
        }
        seen_before = seen;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// What the system has done so far, as counters that only move when it
/// does something: the ledger, every outbox, the order history, the open
/// payments, every group's lag.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    ledger_rows: i64,
    outbox: Vec<(i64, i64)>,
    history_rows: i64,
    payments_pending: i64,
    lag: Vec<i64>,
}

async fn snapshot(stack: &Stack) -> anyhow::Result<Snapshot> {
    let scalar = |db: &'static str, sql: &'static str| {
        let url = stack.db_url(db);
        async move {
            let mut c = sqlx::PgConnection::connect(&url).await?;
            anyhow::Ok(sqlx::query_scalar::<_, i64>(sql).fetch_one(&mut c).await?)
        }
    };
    let mut outbox = Vec::new();
    for db in ["orders", "inventory", "payments"] {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await?;
        outbox.push(
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT (SELECT last_value FROM outbox_id_seq), (SELECT count(*) FROM outbox_published)",
            )
            .fetch_one(&mut c)
            .await?,
        );
    }
    let lag = stack.groups_lag().await.into_iter().map(|l| l.unwrap_or(-1)).collect();
    Ok(Snapshot {
        ledger_rows: scalar("gateway", "SELECT count(*) FROM ledger").await?,
        outbox,
        history_rows: scalar("orders", "SELECT COALESCE(max(id), 0) FROM order_history").await?,
        payments_pending: scalar("payments", "SELECT count(*) FROM payments WHERE status = 'PENDING'").await?,
        lag,
    })
}

/// Waits until [`snapshot`]s stay identical for `window` — longer than the
/// longest deadline, so a reconciler that would still act has acted — or
/// fails at `end`.
async fn wait_quiet(stack: &Stack, window: Duration, end: Instant) -> anyhow::Result<()> {
    let mut last = snapshot(stack).await.ok();
    let mut since = Instant::now();
    loop {
        if last.is_some() && since.elapsed() >= window {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "the system did not stay unchanged for {window:?} (last: {last:?})"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = snapshot(stack).await.ok();
        if now.is_none() || now != last {
            since = Instant::now();
        }
        last = now;
    }
}

/// A per-second sample of progress, taken in the background.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(orders_url: String, acked: Acked, cfg: &ChaosConfig) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let total = if cfg.max_orders > cfg.orders {
            format!("{}+", cfg.orders)
        } else {
            cfg.orders.to_string()
        };
        let (progress, flag) = (cfg.progress, stop.clone());
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
/// Also returns the database audit's own violations (before the log's
/// verdict on late copies is added), for the second look to compare.
async fn verdict(
    stack: &Stack,
    cfg: &ChaosConfig,
    expected: &Expected,
    run: Run,
) -> anyhow::Result<(Report, Vec<String>)> {
    let Schedule {
        timeline,
        crash_points,
        mut duplicates,
        placing_ms,
        unexpected_exits,
    } = run.schedule;
    let (acked, stats) = (run.acked, run.stats);
    let mut audit = audit(stack, expected).await?;
    let first_look = audit.violations.clone();
    let mut problems = Vec::new();
    // Reading the whole log back can time out on a slow broker; try again
    // before giving up, and then say so rather than lose the report.
    let mut counted = Err(anyhow::anyhow!("not tried"));
    for _ in 0..3 {
        counted = report::count_duplicates(stack, &mut duplicates).await;
        if counted.is_ok() {
            break;
        }
    }
    match counted {
        Ok(log) => {
            if log.mislabelled.0 > 0 {
                problems.push(format!(
                    "{} messages in the log whose headers or key disagree with their body, e.g. {:?}",
                    log.mislabelled.0, log.mislabelled.1
                ));
            }
            problems.extend(judge::log_checks(stack, &log, &mut audit).await);
        }
        Err(e) => problems.push(format!("could not read the topics back to count duplicates: {e}")),
    }
    problems.splice(0..0, audit.violations.iter().cloned());
    let outcomes = report::outcomes(stack, &acked).await?;
    problems.extend(report::wrong_outcomes(stack, &acked, &stats).await?);

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
    // An order the client gave up on is an acknowledgement nobody can
    // check: the run must leave none.
    if stats.indeterminate > 0 {
        problems.push(format!(
            "{}: {} orders indeterminate — their clients gave up retrying without an answer",
            crate::invariants::NOTHING_LOST,
            stats.indeterminate
        ));
    }
    // Every dead letter is accounted for: no run of the suite poisons a
    // message on purpose, so each one is a message the saga lost.
    let mut dead_letters = BTreeMap::new();
    match report::dead_letters(stack).await {
        Ok((counts, described)) => {
            let n: usize = counts.values().sum();
            if n > 0 {
                problems.push(format!(
                    "{}: {n} dead letters in a run that poisons nothing on purpose: {described:?}",
                    crate::invariants::NOTHING_LOST
                ));
            }
            dead_letters = counts;
        }
        Err(e) => problems.push(format!("could not read the dead-letter topics back: {e}")),
    }
    let mut invalid = Vec::new();
    for (exit, n) in &unexpected_exits {
        problems.push(format!("a process the schedule did not end exited {n} time(s): {exit}"));
    }
    if let Err(e) = &run.drained {
        problems.push(format!("did not drain: {e}"));
    }
    let kinds = Fault::kinds(cfg.brokers).len();
    if faults_fired.len() < kinds {
        invalid.push(format!("only {} of {kinds} fault kinds fired", faults_fired.len()));
    }
    // Every process crashed in every window armed in it at least once: a
    // consumer inside its open transaction (where an inbox committed apart,
    // or an offset stored first, loses the effect), after its commit,
    // order-api around its commit, the relay between ack and mark.
    let never: Vec<String> = faults::crash_point_pairs()
        .into_iter()
        .filter(|pair| !crash_points.contains_key(pair))
        .collect();
    if !never.is_empty() {
        invalid.push(format!(
            "{} (service, crash point) pairs never fired: {never:?}",
            never.len()
        ));
    }
    if duplicates.delivered() == 0 {
        invalid.push("no duplicates were delivered: the run proves nothing".into());
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
    let offered_per_sec = stats.placed as f64 * 1000.0 / stats.last_first_send_ms.max(1) as f64;
    // A run under load that did not offer the load it names did not test it
    // (its clients all stuck behind an outage, say): a problem of the run,
    // so that its logs are kept like any failed run's.
    if cfg.rate_per_sec.is_finite() && offered_per_sec < cfg.offered_floor * cfg.rate_per_sec {
        invalid.push(format!(
            "orders were offered at {offered_per_sec:.1}/s, under {:.0} % of the {}/s asked (acknowledged {placed_per_sec:.1}/s)",
            cfg.offered_floor * 100.0,
            cfg.rate_per_sec
        ));
    }
    problems.extend(invalid.iter().cloned());
    Ok((
        Report {
            seed: cfg.seed,
            orders: stats.placed,
            negative_control: cfg.negative_control,
            layer_off: cfg.layer_off,
            outcomes,
            clients: stats,
            kills,
            crash_points,
            faults_fired,
            unexpected_exits,
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
            dead_letters,
            invalid,
            problems,
        },
        first_look,
    ))
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
                pending += sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE parked_at IS NULL")
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
    stack
        .groups_lag()
        .await
        .into_iter()
        .map(|l| l.unwrap_or(i64::MAX / 4))
        .sum()
}
