//! The chaos suite: real clients placing orders while real processes are
//! killed, the broker restarts, database connections drop, the gateway
//! misbehaves and duplicates are injected — then the faults stop, the system
//! drains, and every invariant of DESIGN.md is checked.
//!
//! Everything random comes from one seed, so a failing run can be replayed:
//! the order mix, the idempotency keys and the fault schedule.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sqlx::Connection;
use uuid::Uuid;

use crate::driver::{Client, OrderRequest, DECLINED_CARD, GOOD_CARD};
use crate::invariants::{audit, Audit, Expected};
use crate::proxy::Mode;
use crate::stack::{Service, Stack, StackOptions};

/// How to run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Seed of everything random.
    pub seed: u64,
    /// Orders to place.
    pub orders: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Orders started per second (spreads the load over the fault schedule).
    pub rate_per_sec: f64,
    /// Pause between faults.
    pub fault_interval: Duration,
    /// Upper bound for draining after the faults stop.
    pub quiesce_timeout: Duration,
    /// Negative control: payment-service without deduplication.
    pub negative_control: bool,
    /// Print progress lines.
    pub progress: bool,
    /// Where to copy report.json and report.md (besides the run directory).
    pub report_dir: Option<PathBuf>,
}

impl ChaosConfig {
    /// The CI-sized run: 300 orders, every fault kind, a few minutes.
    pub fn ci(seed: u64) -> Self {
        Self {
            seed,
            orders: 300,
            clients: 8,
            rate_per_sec: 10.0,
            fault_interval: Duration::from_millis(800),
            quiesce_timeout: Duration::from_secs(180),
            negative_control: false,
            progress: true,
            report_dir: None,
        }
    }
}

/// The fault kinds of the suite, numbered as in the issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Fault {
    /// 1. SIGKILL (abort) order-api after its commit, before the response.
    OrderApiAfterCommit,
    /// 2. Abort the relay after the broker ack, before marking published.
    RelayAfterPublish,
    /// 3. Abort a consumer after its DB commit, before its offset commit.
    ConsumerBeforeOffsetCommit,
    /// 4. Abort payment-service after the gateway charged, before recording.
    PaymentAfterCharge,
    /// 5. SIGKILL + restart of a random service.
    RandomKill,
    /// 6. SIGKILL + restart of the broker.
    BrokerRestart,
    /// 7. `pg_terminate_backend` on every connection of the stack.
    DatabaseConnectionsDropped,
    /// 8. The gateway commits, then times out.
    GatewayTimeoutAfterCommit,
    /// 9. Gateway 5xx bursts and latency.
    Gateway5xxAndLatency,
    /// 10. Latency, reset or blackhole between payment-service and gateway.
    NetworkFault,
    /// 11. Second instances of inventory- and payment-service at once.
    TwoConsumerInstances,
    /// 12. Duplicates injected onto the topics with a raw producer.
    DuplicateInjection,
}

impl Fault {
    /// The first round: faults that need traffic (crash points, gateway
    /// faults) go first, while the clients are still placing orders.
    const FIRST_ROUND: [Fault; 12] = [
        Fault::OrderApiAfterCommit,
        Fault::PaymentAfterCharge,
        Fault::GatewayTimeoutAfterCommit,
        Fault::RelayAfterPublish,
        Fault::Gateway5xxAndLatency,
        Fault::ConsumerBeforeOffsetCommit,
        Fault::NetworkFault,
        Fault::DuplicateInjection,
        Fault::TwoConsumerInstances,
        Fault::RandomKill,
        Fault::BrokerRestart,
        Fault::DatabaseConnectionsDropped,
    ];
}

/// One fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    /// Milliseconds since the load started.
    pub at_ms: u64,
    /// Which fault.
    pub fault: Fault,
    /// What exactly (service, crash point, mode) and whether it fired.
    pub detail: String,
    /// Whether the fault really happened (a crash point that saw no traffic did not).
    pub fired: bool,
}

/// A per-second sample of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub second: u64,
    /// Orders acknowledged so far.
    pub acknowledged: usize,
    /// Orders in the database not yet terminal.
    pub in_flight: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Payable,
    Declined,
    OutOfStock,
}

#[derive(Debug, Clone)]
struct Planned {
    kind: Kind,
    key: String,
    request: OrderRequest,
    resend: bool,
    cancel: bool,
}

/// What the clients saw.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ClientStats {
    /// Orders acknowledged with 201.
    pub acknowledged: usize,
    /// Orders the client gave up on (outcome unknown).
    pub indeterminate: usize,
    /// Orders refused with a final 4xx.
    pub rejected: usize,
    /// HTTP attempts beyond the first, with the same key.
    pub retries: usize,
    /// Retries answered by a replayed response (the first attempt had committed).
    pub replays: usize,
    /// 409 "in flight" answers.
    pub in_flight_409: usize,
    /// Cancels requested and acknowledged.
    pub cancels: usize,
    /// Deliberate re-sends of an acknowledged request.
    pub resends: usize,
    /// Idempotency violations seen by clients (a key answered with two orders).
    pub violations: Vec<String>,
}

/// Duplicate accounting.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Duplicates {
    /// Messages re-produced onto each topic by the injector.
    pub injected: BTreeMap<String, usize>,
    /// Copies beyond the first of an event id, per topic, in the broker's log.
    pub in_log: BTreeMap<String, usize>,
    /// Redeliveries absorbed by each consumer's inbox (durable count).
    pub absorbed: BTreeMap<String, i64>,
}

impl Duplicates {
    /// Duplicates delivered to consumers (at least what sits in the log).
    pub fn delivered(&self) -> usize {
        self.in_log.values().sum()
    }

    /// Duplicates the inboxes absorbed.
    pub fn total_absorbed(&self) -> i64 {
        self.absorbed.values().sum()
    }
}

/// The report of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seed.
    pub seed: u64,
    /// Orders planned.
    pub orders: usize,
    /// Negative control run.
    pub negative_control: bool,
    /// Orders per intended kind and final status.
    pub outcomes: BTreeMap<String, BTreeMap<String, i64>>,
    /// Client view.
    pub clients: ClientStats,
    /// Kills per service (SIGKILLs by the harness plus crash-point aborts).
    pub kills: BTreeMap<String, u32>,
    /// Crash points that fired.
    pub crash_points: BTreeMap<String, u32>,
    /// Faults by kind (fired).
    pub faults_fired: BTreeMap<String, u32>,
    /// The timeline.
    pub timeline: Vec<FaultEvent>,
    /// Per-second samples.
    pub samples: Vec<Sample>,
    /// Duplicates delivered and absorbed.
    pub duplicates: Duplicates,
    /// Time from the last fault to a drained system.
    pub quiesce_ms: u64,
    /// Load duration.
    pub load_ms: u64,
    /// The invariant audit.
    pub audit: Audit,
    /// Reasons the run does not count or failed (empty: passed).
    pub problems: Vec<String>,
}

impl Report {
    /// Whether every invariant held and the faults really happened.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Runs the suite on a fresh stack and returns its report.
pub async fn run(cfg: &ChaosConfig) -> anyhow::Result<Report> {
    let label = if cfg.negative_control { "chaos-neg" } else { "chaos" };
    let mut opts = StackOptions::ephemeral(label)?;
    opts.gateway_proxy = true;
    opts.extra_env
        .push((Service::Payment, "GATEWAY_TIMEOUT_MS".into(), "1000".into()));
    if cfg.negative_control {
        opts.extra_env
            .push((Service::Payment, "PAYMENT_UNSAFE_DISABLE_DEDUP".into(), "true".into()));
    }
    let run_dir = opts.run_dir.clone();
    if cfg.progress {
        eprintln!(
            "chaos: seed {} · {} orders · logs in {}",
            cfg.seed,
            cfg.orders,
            run_dir.display()
        );
    }
    let mut stack = Stack::start(opts).await?;
    let result = drive(&mut stack, cfg).await;
    if let Ok(report) = &result {
        let json = serde_json::to_vec_pretty(report)?;
        let md = markdown(report);
        for dir in std::iter::once(run_dir.clone()).chain(cfg.report_dir.clone()) {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("report.json"), &json)?;
            std::fs::write(dir.join("report.md"), &md)?;
        }
    }
    // Keep the logs (and the report) of a run that went wrong.
    let keep = match &result {
        Err(_) => true,
        Ok(r) => !cfg.negative_control && !r.passed(),
    };
    if keep && cfg.progress {
        eprintln!("chaos: logs and report kept in {}", run_dir.display());
    }
    stack.shutdown(!keep).await?;
    result
}

async fn drive(stack: &mut Stack, cfg: &ChaosConfig) -> anyhow::Result<Report> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let client = Client::new(stack, Duration::from_secs(2))?;
    let stock = [
        ("WIDGET", (cfg.orders * 3) as i32),
        ("GADGET", (cfg.orders * 3) as i32),
        ("RARE", 5),
    ];
    for (sku, n) in stock {
        client.seed_stock(sku, n).await?;
    }
    let plan = plan(&mut rng, cfg.orders);

    // Clients.
    let started = Instant::now();
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let acked: Arc<Mutex<BTreeMap<String, (Uuid, Kind)>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let plan = Arc::new(plan);
    let cancels = Arc::new(tokio::sync::Mutex::new(tokio::task::JoinSet::new()));
    let rate = cfg.rate_per_sec;
    let workers: Vec<_> = (0..cfg.clients)
        .map(|_| {
            let (client, stats, acked, next, plan, cancels) = (
                client.clone(),
                stats.clone(),
                acked.clone(),
                next.clone(),
                plan.clone(),
                cancels.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(p) = plan.get(i) else { return };
                    // Order i starts no earlier than i / rate seconds into the run.
                    let due = started + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                    if let Some(id) = place(&client, p, &stats, &acked).await {
                        if p.cancel {
                            let (client, stats) = (client.clone(), stats.clone());
                            cancels
                                .lock()
                                .await
                                .spawn(async move { cancel_when_confirmed(&client, id, &stats).await });
                        }
                    }
                }
            })
        })
        .collect();

    // Progress samples.
    let orders_url = stack.db_url("orders");
    let sampler_acked = acked.clone();
    let sampler_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = sampler_stop.clone();
        let progress = cfg.progress;
        let total = cfg.orders;
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let t0 = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let in_flight = non_terminal(&orders_url).await.unwrap_or(-1);
                let acknowledged = sampler_acked.lock().expect("acked").len();
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
        })
    };

    // Faults, while the clients work (and until every kind fired once).
    let mut timeline = Vec::new();
    let mut crash_points: BTreeMap<String, u32> = BTreeMap::new();
    let mut duplicates = Duplicates::default();
    let mut round: Vec<Fault> = Fault::FIRST_ROUND.to_vec();
    let mut fired_kinds = BTreeSet::new();
    let mut left_after_clients: Option<usize> = None;
    loop {
        let clients_done = workers.iter().all(|w| w.is_finished());
        if clients_done && fired_kinds.len() == Fault::FIRST_ROUND.len() {
            break;
        }
        // Without traffic the crash points cannot fire: after the clients are
        // done, fire at most one more round, then report what never fired.
        if clients_done {
            let left = left_after_clients.get_or_insert(Fault::FIRST_ROUND.len());
            if *left == 0 {
                break;
            }
            *left -= 1;
        }
        let jitter = rng.gen_range(0..=cfg.fault_interval.as_millis() as u64 / 2);
        tokio::time::sleep(cfg.fault_interval + Duration::from_millis(jitter)).await;
        end_windows(stack, &client).await;
        if round.is_empty() {
            round = Fault::FIRST_ROUND.to_vec();
            round.shuffle(&mut rng);
        }
        let fault = round.remove(0);
        let at_ms = started.elapsed().as_millis() as u64;
        let (detail, fired) = inject(stack, &client, &mut rng, fault, &mut crash_points, &mut duplicates).await?;
        if cfg.progress {
            eprintln!("chaos: t={:>5.1}s fault {fault:?}: {detail}", at_ms as f64 / 1000.0);
        }
        if fired {
            fired_kinds.insert(fault);
        }
        timeline.push(FaultEvent {
            at_ms,
            fault,
            detail,
            fired,
        });
    }
    for w in workers {
        w.await?;
    }
    let mut cancels = std::mem::take(&mut *cancels.lock().await);
    while cancels.join_next().await.is_some() {}
    let load_ms = started.elapsed().as_millis() as u64;

    // Faults stop; everything runs again; wait for the system to drain.
    end_windows(stack, &client).await;
    for s in Service::ALL {
        stack.set_env(s, "FAILPOINTS", "");
        if !stack.is_running(s) {
            stack.start_service(s).await?;
        }
    }
    let calm = Instant::now();
    let drained = wait_drained(stack, cfg.quiesce_timeout).await;
    let quiesce_ms = calm.elapsed().as_millis() as u64;
    sampler_stop.store(true, Ordering::SeqCst);
    let samples = sampler.await?;

    // Audit.
    let acked = acked.lock().expect("acked").clone();
    let stats = stats.lock().expect("stats").clone();
    let expected = Expected {
        initial_stock: stock.iter().map(|(s, n)| ((*s).to_owned(), i64::from(*n))).collect(),
        acknowledged: acked.iter().map(|(k, (id, _))| (k.clone(), *id)).collect(),
        indeterminate: stats.indeterminate,
    };
    let audit = audit(stack, &expected).await?;
    let mut problems = audit.violations.clone();
    // Reading the whole log back can time out on a slow broker; try again
    // before giving up, and then say so rather than lose the report.
    let mut counted = Err(anyhow::anyhow!("not tried"));
    for _ in 0..3 {
        counted = count_duplicates(stack, &mut duplicates).await;
        if counted.is_ok() {
            break;
        }
    }
    if let Err(e) = counted {
        problems.push(format!("could not read the topics back to count duplicates: {e}"));
    }
    let outcomes = outcomes(stack, &acked).await?;

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
    if let Err(e) = &drained {
        problems.push(format!("did not drain: {e}"));
    }
    if faults_fired.len() < Fault::FIRST_ROUND.len() {
        problems.push(format!("only {} of 12 fault kinds fired", faults_fired.len()));
    }
    if duplicates.delivered() == 0 {
        problems.push("no duplicates were delivered: the run proves nothing".into());
    }
    // Every duplicate copy in the log reached its consumer and was absorbed
    // (the inboxes also count redeliveries the log does not show: offsets
    // not committed before a crash, a second instance reading the same partitions).
    if !cfg.negative_control && duplicates.total_absorbed() < duplicates.delivered() as i64 {
        problems.push(format!(
            "{} duplicates in the log but only {} absorbed by the inboxes",
            duplicates.delivered(),
            duplicates.total_absorbed()
        ));
    }
    Ok(Report {
        seed: cfg.seed,
        orders: cfg.orders,
        negative_control: cfg.negative_control,
        outcomes,
        clients: stats,
        kills,
        crash_points,
        faults_fired,
        timeline,
        samples,
        duplicates,
        quiesce_ms,
        load_ms,
        audit,
        problems,
    })
}

fn plan(rng: &mut StdRng, n: usize) -> Vec<Planned> {
    (0..n)
        .map(|i| {
            let roll: f64 = rng.gen();
            let (kind, request) = if roll < 0.8 {
                let sku = if rng.gen_bool(0.5) { "WIDGET" } else { "GADGET" };
                (
                    Kind::Payable,
                    OrderRequest {
                        sku: sku.into(),
                        quantity: rng.gen_range(1..=3),
                        amount_cents: rng.gen_range(100..50_000),
                        card: GOOD_CARD.into(),
                    },
                )
            } else if roll < 0.9 {
                (
                    Kind::Declined,
                    OrderRequest {
                        sku: "WIDGET".into(),
                        quantity: 1,
                        amount_cents: 999,
                        card: DECLINED_CARD.into(),
                    },
                )
            } else {
                (
                    Kind::OutOfStock,
                    OrderRequest {
                        sku: "RARE".into(),
                        quantity: 4,
                        amount_cents: 4_444,
                        card: GOOD_CARD.into(),
                    },
                )
            };
            let key = Uuid::from_u128(rng.gen()).to_string();
            Planned {
                kind,
                key,
                request,
                resend: i % 10 == 3,
                cancel: kind == Kind::Payable && rng.gen_bool(0.05),
            }
        })
        .collect()
}

/// Places one order as a careful client: retries with the same key.
/// Returns the order id once acknowledged.
async fn place(
    client: &Client,
    p: &Planned,
    stats: &Mutex<ClientStats>,
    acked: &Mutex<BTreeMap<String, (Uuid, Kind)>>,
) -> Option<Uuid> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut attempts = 0usize;
    let mut delay = Duration::from_millis(100);
    let id = loop {
        attempts += 1;
        match client.post_order(&p.key, &p.request).await {
            Ok(r) if r.status == 201 => {
                let mut s = stats.lock().expect("stats");
                if attempts > 1 && r.replayed {
                    s.replays += 1;
                }
                break serde_json::from_str::<crate::driver::OrderView>(&r.body)
                    .ok()
                    .map(|o| o.id);
            }
            Ok(r) if r.status == 409 => stats.lock().expect("stats").in_flight_409 += 1,
            Ok(r) if r.status < 500 => {
                let mut s = stats.lock().expect("stats");
                s.rejected += 1;
                s.violations
                    .push(format!("order {} refused: {} {}", p.key, r.status, r.body));
                return None;
            }
            _ => {}
        }
        if Instant::now() > deadline {
            let mut s = stats.lock().expect("stats");
            s.indeterminate += 1;
            s.retries += attempts - 1;
            return None;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    };
    let id = id?;
    {
        let mut s = stats.lock().expect("stats");
        s.acknowledged += 1;
        s.retries += attempts - 1;
    }
    acked.lock().expect("acked").insert(p.key.clone(), (id, p.kind));
    if p.resend {
        // The client never saw the answer and sends again: same order.
        if let Ok(r) = client.post_order(&p.key, &p.request).await {
            let mut s = stats.lock().expect("stats");
            s.resends += 1;
            if r.status == 201 {
                let again = serde_json::from_str::<crate::driver::OrderView>(&r.body)
                    .ok()
                    .map(|o| o.id);
                if again != Some(id) || !r.replayed {
                    s.violations
                        .push(format!("key {} answered with order {again:?}, first {id}", p.key));
                }
            }
        }
    }
    Some(id)
}

async fn cancel_when_confirmed(client: &Client, id: Uuid, stats: &Mutex<ClientStats>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match client.order(id).await {
            Ok(o) if o.status == "CONFIRMED" => break,
            Ok(o) if o.status == "CANCELLED" => return,
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    let key = format!("cancel-{id}");
    let mut attempts = 0;
    while Instant::now() < deadline {
        attempts += 1;
        match client.cancel(&key, id).await {
            Ok(r) if r.status == 202 || r.status == 200 => {
                let mut s = stats.lock().expect("stats");
                s.cancels += 1;
                s.retries += attempts - 1;
                if attempts > 1 && r.replayed {
                    s.replays += 1;
                }
                return;
            }
            Ok(r) if r.status == 409 && r.body.contains("only CONFIRMED") => return,
            Ok(r) if r.status == 409 => stats.lock().expect("stats").in_flight_409 += 1,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Ends the windowed faults (gateway faults, network mode, extra instances).
async fn end_windows(stack: &mut Stack, client: &Client) {
    if let Some(p) = stack.gateway_proxy() {
        p.set(Mode::Pass);
    }
    stack.kill_extras().await;
    if stack.is_running(Service::Gateway) {
        client.set_gateway_faults(serde_json::json!({})).await.ok();
    }
}

async fn inject(
    stack: &mut Stack,
    client: &Client,
    rng: &mut StdRng,
    fault: Fault,
    crash_points: &mut BTreeMap<String, u32>,
    duplicates: &mut Duplicates,
) -> anyhow::Result<(String, bool)> {
    Ok(match fault {
        Fault::OrderApiAfterCommit => {
            crash_point(
                stack,
                Service::OrderApi,
                "order_api::after_commit_before_response",
                crash_points,
            )
            .await?
        }
        Fault::RelayAfterPublish => {
            crash_point(stack, Service::Relay, "relay::after_publish_before_mark", crash_points).await?
        }
        Fault::PaymentAfterCharge => {
            crash_point(
                stack,
                Service::Payment,
                "payment::after_gateway_before_record",
                crash_points,
            )
            .await?
        }
        Fault::ConsumerBeforeOffsetCommit => {
            let s = *[Service::Inventory, Service::Payment, Service::OrderApi]
                .choose(rng)
                .expect("non-empty");
            crash_point(stack, s, "consumer::before_offset_commit", crash_points).await?
        }
        Fault::RandomKill => {
            let s = *[
                Service::OrderApi,
                Service::Relay,
                Service::Inventory,
                Service::Payment,
                Service::Gateway,
            ]
            .choose(rng)
            .expect("non-empty");
            stack.restart(s).await?;
            (format!("SIGKILL + restart {}", s.name()), true)
        }
        Fault::BrokerRestart => {
            stack.restart(Service::Broker).await?;
            ("SIGKILL + restart tansu".into(), true)
        }
        Fault::DatabaseConnectionsDropped => {
            let n = stack.terminate_db_connections().await?;
            (format!("pg_terminate_backend on {n} connections"), n > 0)
        }
        Fault::GatewayTimeoutAfterCommit => {
            client
                .set_gateway_faults(serde_json::json!({"timeout_after_commit_rate": 0.3, "hang_ms": 1500}))
                .await?;
            ("gateway: 30 % commit-then-hang 1.5 s (client timeout 1 s)".into(), true)
        }
        Fault::Gateway5xxAndLatency => {
            client
                .set_gateway_faults(serde_json::json!({"fail_rate": 0.3, "latency_ms": 50}))
                .await?;
            ("gateway: 30 % 503 before commit, +50 ms".into(), true)
        }
        Fault::NetworkFault => {
            let mode = *[Mode::Latency(Duration::from_millis(150)), Mode::Reset, Mode::Blackhole]
                .choose(rng)
                .expect("non-empty");
            let proxy = stack
                .gateway_proxy()
                .ok_or_else(|| anyhow::anyhow!("no gateway proxy"))?;
            proxy.set(mode);
            (format!("payment → gateway: {mode:?}"), true)
        }
        Fault::TwoConsumerInstances => {
            let a = stack.start_extra(Service::Inventory).await?;
            let b = stack.start_extra(Service::Payment).await?;
            (
                format!("second inventory-service (pid {a}) and payment-service (pid {b})"),
                true,
            )
        }
        Fault::DuplicateInjection => {
            let n = inject_duplicates(stack, rng, duplicates).await?;
            (format!("{n} messages re-produced with their event ids"), n > 0)
        }
    })
}

/// Restarts `s` armed with a crash point that aborts the process the next
/// time it is reached, waits for the abort, and restarts it unarmed.
async fn crash_point(
    stack: &mut Stack,
    s: Service,
    point: &str,
    crash_points: &mut BTreeMap<String, u32>,
) -> anyhow::Result<(String, bool)> {
    stack.set_env(s, "FAILPOINTS", &format!("{point}=1*return"));
    stack.restart_unready(s).await?;
    let fired = stack.wait_exit(s, Duration::from_secs(20)).await.is_ok();
    stack.set_env(s, "FAILPOINTS", "");
    if fired {
        *crash_points.entry(format!("{}: {point}", s.name())).or_default() += 1;
        stack.start_service(s).await?;
    } else {
        stack.restart(s).await?;
    }
    Ok((
        format!(
            "{} at {point}{}",
            s.name(),
            if fired { "" } else { " (no traffic reached it)" }
        ),
        fired,
    ))
}

async fn inject_duplicates(stack: &Stack, rng: &mut StdRng, duplicates: &mut Duplicates) -> anyhow::Result<usize> {
    let brokers = stack.brokers();
    let producer = messaging::kafka::producer(&brokers)?;
    let mut total = 0;
    for topic in messaging::message::TOPICS {
        let group = format!("chaos-injector-{}", Uuid::new_v4());
        let (messages, _) = {
            let (b, t) = (brokers.clone(), topic.to_owned());
            tokio::task::spawn_blocking(move || {
                messaging::kafka::read_topic_at_most(
                    &b,
                    &t,
                    &group,
                    rdkafka::Offset::Beginning,
                    Duration::from_millis(1500),
                    60,
                )
            })
            .await??
        };
        let picks: Vec<_> = messages.choose_multiple(rng, 25.min(messages.len())).cloned().collect();
        for m in &picks {
            use rdkafka::Message as _;
            let Ok(env) = messaging::Envelope::from_bytes(m.payload().unwrap_or_default()) else {
                continue;
            };
            messaging::kafka::publish(&producer, topic, &env).await?;
            total += 1;
            *duplicates.injected.entry(topic.to_owned()).or_default() += 1;
        }
    }
    Ok(total)
}

async fn non_terminal(orders_url: &str) -> anyhow::Result<i64> {
    let mut c = sqlx::PgConnection::connect(orders_url).await?;
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE status NOT IN ('CONFIRMED', 'CANCELLED')")
            .fetch_one(&mut c)
            .await?,
    )
}

/// Waits until no order is mid-saga and every outbox is drained.
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
        if busy == 0 && pending == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "{busy} orders mid-saga, {pending} outbox rows pending after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn count_duplicates(stack: &Stack, d: &mut Duplicates) -> anyhow::Result<()> {
    let brokers = stack.brokers();
    for topic in messaging::message::TOPICS {
        let (b, t) = (brokers.clone(), topic.to_owned());
        let group = format!("chaos-audit-{}", Uuid::new_v4());
        let (messages, _) = tokio::task::spawn_blocking(move || {
            messaging::kafka::read_topic(&b, &t, &group, rdkafka::Offset::Beginning, Duration::from_secs(2))
        })
        .await??;
        let mut seen: BTreeMap<Uuid, usize> = BTreeMap::new();
        for m in &messages {
            use rdkafka::Message as _;
            if let Ok(env) = messaging::Envelope::from_bytes(m.payload().unwrap_or_default()) {
                *seen.entry(env.event_id).or_default() += 1;
            }
        }
        d.in_log.insert(topic.to_owned(), seen.values().map(|n| n - 1).sum());
    }
    for (db, consumer) in [
        ("orders", "order-saga"),
        ("inventory", "inventory-service"),
        ("payments", "payment-service"),
    ] {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await?;
        let n: i64 = sqlx::query_scalar("SELECT COALESCE(sum(redeliveries), 0)::int8 FROM inbox_redeliveries")
            .fetch_one(&mut c)
            .await?;
        d.absorbed.insert(consumer.to_owned(), n);
    }
    Ok(())
}

async fn outcomes(
    stack: &Stack,
    acked: &BTreeMap<String, (Uuid, Kind)>,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, i64>>> {
    let mut c = sqlx::PgConnection::connect(&stack.db_url("orders")).await?;
    let rows: Vec<(Uuid, String)> = sqlx::query_as("SELECT id, status FROM orders")
        .fetch_all(&mut c)
        .await?;
    let status: BTreeMap<Uuid, String> = rows.into_iter().collect();
    let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (id, kind) in acked.values() {
        let s = status.get(id).cloned().unwrap_or_else(|| "MISSING".into());
        *out.entry(format!("{kind:?}")).or_default().entry(s).or_default() += 1;
    }
    Ok(out)
}

/// The human report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let verdict = match (r.negative_control, r.audit.double_charged.is_empty(), r.passed()) {
        (true, false, _) => "NEGATIVE CONTROL: double charges found, as they must be",
        (true, true, _) => "NEGATIVE CONTROL FAILED: no double charge found",
        (false, _, true) => "PASSED",
        (false, _, false) => "FAILED",
    };
    let _ = writeln!(s, "# Chaos run — seed {} — {verdict}\n", r.seed);
    let _ = writeln!(
        s,
        "Replay with `cargo xtask chaos --orders {} --seed {}`{}.\n",
        r.orders,
        r.seed,
        if r.negative_control { " --negative-control" } else { "" }
    );
    let _ = writeln!(s, "## Outcome\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(
        s,
        "| orders planned / acknowledged / indeterminate | {} / {} / {} |",
        r.orders, r.clients.acknowledged, r.clients.indeterminate
    );
    let _ = writeln!(s, "| orders by status | {:?} |", r.audit.orders_by_status);
    let _ = writeln!(s, "| **double charges** | **{}** |", r.audit.double_charged.len());
    let _ = writeln!(s, "| **lost orders** | **{}** |", r.audit.lost.len());
    let _ = writeln!(s, "| **stuck orders** | **{}** |", r.audit.stuck.len());
    let _ = writeln!(
        s,
        "| ledger | {} captures, {} declines, {} refunds |",
        r.audit.captures, r.audit.declines, r.audit.refunds
    );
    let _ = writeln!(
        s,
        "| load / time to quiesce | {:.1} s / {:.1} s |",
        r.load_ms as f64 / 1000.0,
        r.quiesce_ms as f64 / 1000.0
    );
    let _ = writeln!(s, "\nBy intended kind → final status: {:?}\n", r.outcomes);
    let _ = writeln!(s, "## HTTP layer\n");
    let c = &r.clients;
    let _ = writeln!(s, "retries with the same key {}, of which answered by a replay {}, 409 in flight {}, deliberate re-sends {}, cancels {}\n", c.retries, c.replays, c.in_flight_409, c.resends, c.cancels);
    let _ = writeln!(s, "## Faults\n");
    let _ = writeln!(s, "kills per service: {:?}\n", r.kills);
    let _ = writeln!(s, "crash points fired: {:?}\n", r.crash_points);
    let _ = writeln!(s, "| t (s) | fault | detail |\n|---:|---|---|");
    for e in &r.timeline {
        let _ = writeln!(
            s,
            "| {:.1} | {:?}{} | {} |",
            e.at_ms as f64 / 1000.0,
            e.fault,
            if e.fired { "" } else { " (not fired)" },
            e.detail
        );
    }
    let _ = writeln!(s, "\n## Duplicates\n");
    let d = &r.duplicates;
    let _ = writeln!(s, "injected per topic: {:?}\n", d.injected);
    let _ = writeln!(
        s,
        "duplicate copies in the broker's log (each delivered at least once): {:?} — total {}\n",
        d.in_log,
        d.delivered()
    );
    let _ = writeln!(s, "duplicate deliveries absorbed by the inboxes (durable count; includes redeliveries after crashes and by second instances): {:?} — total {}\n", d.absorbed, d.total_absorbed());
    let _ = writeln!(
        s,
        "duplicate effects: {} double charges in the gateway ledger\n",
        r.audit.double_charged.len()
    );
    let _ = writeln!(
        s,
        "## Timeline (per second)\n\n| s | acknowledged | not terminal |\n|---:|---:|---:|"
    );
    for sample in &r.samples {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            sample.second, sample.acknowledged, sample.in_flight
        );
    }
    let _ = writeln!(s, "\n## Problems\n");
    if r.problems.is_empty() {
        let _ = writeln!(s, "none");
    }
    for p in &r.problems {
        let _ = writeln!(s, "- {p}");
    }
    s
}
