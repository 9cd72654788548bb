//! The faults of the suite and their schedule: crash points that abort a
//! process at a named place, SIGKILLs, a broker restart, dropped database
//! connections, a misbehaving gateway and network, second consumer
//! instances, and duplicates injected onto the topics.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use serde::Serialize;

use super::clients::Clients;
use super::report::Duplicates;
use super::ChaosConfig;
use crate::driver::Client;
use crate::proxy::Mode;
use crate::stack::{Service, Stack};

mod crash;
mod partition;
mod schedule;
pub use crash::crash_point_pairs;
use crash::{crash_at, crash_points_of, every_pair_fired};
pub use schedule::{choose, Choice, Plan};

/// The fault kinds of the suite, numbered as in the issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub enum Fault {
    /// 1. SIGKILL (abort) order-api after its commit, before the response.
    OrderApiAfterCommit,
    /// 2. Abort the relay after the broker ack, before marking published.
    RelayAfterPublish,
    /// 3. Abort every consumer (order saga, inventory, payment) after its
    ///    DB commit of a batch that applied something, before its offset commit.
    ConsumerBeforeOffsetCommit,
    /// 4. Abort payment-service after a gateway call that happened, before recording it.
    PaymentAfterCharge,
    /// 5. SIGKILL + restart of a random service.
    RandomKill,
    /// 6. SIGKILL + restart of a broker node (one of three in a cluster).
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
    /// 13. A rebalance mid-batch: extra inventory- and payment-service
    ///     instances join their groups and are given partitions (fired on the
    ///     joiners' own `consumer_partitions_assigned`; the running instances'
    ///     revocations are reported beside it), then leave (SIGTERM), handing
    ///     the partitions back.
    Rebalance,
    /// 14. Abort order-api inside the order's transaction, before it commits.
    OrderApiBeforeCommit,
    /// 15. Abort every consumer with its batch's transaction open: the inbox
    ///     rows and the effects written, not committed (a batch with fresh work).
    ConsumerInTransaction,
    /// 16. Crash PostgreSQL: SIGKILL to the postmaster and every backend at
    ///     once, 3 s down, then crash recovery. Fired when the postmaster died
    ///     of the signal, the server's log shows the recovery, a new
    ///     postmaster accepts, and every service answered not-ready while it
    ///     was down and ready again after, none restarted.
    PostgresCrash,
    /// 17. One consumer service cut from every Kafka node for 12 s, longer
    ///     than its session: it loses its group coordinator with work in
    ///     hand. Its database stays reachable. (A consumer always talks to the
    ///     brokers — heartbeats, fetches — so the cut always has packets to
    ///     drop; an idle producer may send none for minutes.)
    ///     nftables drops the packets of its uid to the brokers' ports; fired
    ///     on the rule's own drop counter.
    ServiceCutFromBrokers,
    /// 18. One Kafka node cut from the other two (controller quorum and
    ///     replication, both ways) for 15 s while clients still reach it;
    ///     fired on the rules' drop counters. Three nodes only.
    KafkaNodeIsolated,
}

impl Fault {
    /// The first round: faults that need traffic (crash points, gateway
    /// faults, second instances that must be given partitions and then
    /// handle a message) go first, while the clients are still placing
    /// orders; second instances early, as joining a group takes seconds on
    /// Apache Kafka (late in the round, the clients had finished before the
    /// group gave them anything). Faults that fire without traffic (a
    /// rebalance is judged on the assignment, kills on the exit) go last.
    pub const FIRST_ROUND: [Fault; 18] = [
        Fault::ConsumerInTransaction,
        Fault::OrderApiAfterCommit,
        Fault::PaymentAfterCharge,
        Fault::TwoConsumerInstances,
        Fault::GatewayTimeoutAfterCommit,
        Fault::RelayAfterPublish,
        Fault::OrderApiBeforeCommit,
        Fault::Gateway5xxAndLatency,
        Fault::ConsumerBeforeOffsetCommit,
        Fault::NetworkFault,
        Fault::DuplicateInjection,
        Fault::Rebalance,
        Fault::RandomKill,
        Fault::BrokerRestart,
        Fault::DatabaseConnectionsDropped,
        Fault::PostgresCrash,
        Fault::KafkaNodeIsolated,
        Fault::ServiceCutFromBrokers,
    ];

    /// The kinds a run on `brokers` Kafka nodes can fire: a node can be
    /// isolated from the others only in a cluster of three.
    pub fn kinds(brokers: u32) -> Vec<Fault> {
        Self::FIRST_ROUND
            .into_iter()
            .filter(|f| brokers >= 3 || *f != Fault::KafkaNodeIsolated)
            .collect()
    }
}

/// One fault as it happened.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
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

/// Evidence a windowed fault is judged on when its window ends: the
/// gateway's own fault counter, the proxy's count of what it did, or the
/// extra instances' own count of messages handled.
enum Window {
    Gateway {
        label: &'static str,
        before: f64,
    },
    Network {
        before: u64,
    },
    Extras {
        urls: Vec<(u32, String)>,
    },
    Rebalance {
        revokes_before: Vec<(Service, f64)>,
        extras: Vec<(u32, String)>,
    },
}

/// Revocations the stack's own instance of `s` has seen (its own metric).
pub(super) async fn revocations(stack: &Stack, s: Service) -> f64 {
    Stack::metric(&stack.admin_url(s), "consumer_rebalances_total", &[("kind", "revoke")])
        .await
        .unwrap_or(0.0)
}

/// How much longer a gateway or network window stays open for its first
/// affected call.
const WINDOW_GRACE: Duration = Duration::from_secs(15);

/// Closes the open window, if any: marks its fault fired only on evidence.
async fn close_window(
    stack: &mut Stack,
    open: &mut Option<(usize, Window)>,
    timeline: &mut [FaultEvent],
    fired_kinds: &mut BTreeSet<Fault>,
) {
    let Some((i, window)) = open.take() else { return };
    let (fired, evidence) = match window {
        Window::Gateway { label, before } => {
            // A 30 % fault over one interval's few calls can miss them all
            // (0.7^7 ≈ 8 %), and payments may pause for seconds (a crashed
            // service restarting): the window stays open (up to
            // `WINDOW_GRACE` more) until the gateway has injected one.
            let deadline = Instant::now() + WINDOW_GRACE;
            let injected = loop {
                let now = Stack::metric(
                    &stack.admin_url(Service::Gateway),
                    "gateway_injected_faults_total",
                    &[("fault", label)],
                )
                .await
                .unwrap_or(0.0);
                // A restarted gateway starts counting from zero again.
                let injected = if now >= before { now - before } else { now };
                if injected > 0.0 || Instant::now() >= deadline {
                    break injected;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            (injected > 0.0, format!("the gateway counted {injected} {label} faults"))
        }
        Window::Network { before } => {
            // Likewise until the proxy has acted on a call.
            let deadline = Instant::now() + WINDOW_GRACE;
            let mut acted = stack.gateway_proxy().map_or(0, |p| p.acted()) - before;
            while acted == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                acted = stack.gateway_proxy().map_or(0, |p| p.acted()) - before;
            }
            (acted > 0, format!("the proxy acted {acted} times"))
        }
        Window::Rebalance { revokes_before, extras } => {
            // Joining takes a rebalance (a heartbeat or two, longer while a
            // SIGKILLed member's session runs out): wait up to 20 s for the
            // group to give the joiners partitions — taken from the running
            // instances, or the orphans of a killed one.
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut given = 0.0;
            while given == 0.0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                given = 0.0;
                for (_, url) in &extras {
                    given += Stack::metric(url, "consumer_partitions_assigned", &[])
                        .await
                        .unwrap_or(0.0);
                }
            }
            let mut revoked = Vec::new();
            for (s, before) in &revokes_before {
                let now = revocations(stack, *s).await;
                // A restarted instance counts from zero again.
                revoked.push(format!(
                    "{} revoked {} times",
                    s.name(),
                    if now >= *before { now - before } else { now }
                ));
            }
            // … and leave again while batches are in flight: a revocation on
            // each joiner, its partitions back to the running instances.
            for (pid, _) in &extras {
                stack.stop_extra(*pid).await;
            }
            (
                given > 0.0,
                format!(
                    "the group gave the joiners {given} partitions ({}); they left by SIGTERM",
                    revoked.join(", ")
                ),
            )
        }
        Window::Extras { urls } => {
            // A second instance has to start, join and fetch before it can
            // handle anything: on a slow machine that takes longer than one
            // fault interval, so the window stays open (up to 10 s) until
            // one of them has handled a message.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut handled = Vec::new();
            loop {
                handled.clear();
                for (pid, url) in &urls {
                    let n = Stack::metric(url, "consumer_messages_received_total", &[])
                        .await
                        .unwrap_or(0.0);
                    // A count: whole and never negative (a sum of no
                    // samples can print as "-0").
                    handled.push((*pid, n.max(0.0).round() as u64));
                }
                if handled.iter().any(|(_, n)| *n > 0) || std::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            let words: Vec<String> = handled
                .iter()
                .map(|(pid, n)| format!("pid {pid}: {n} messages"))
                .collect();
            (
                handled.iter().any(|(_, n)| *n > 0),
                format!("handled by the extra instances: {}", words.join(", ")),
            )
        }
    };
    let event = &mut timeline[i];
    event.fired = fired;
    event.detail = format!("{} — {evidence}", event.detail);
    if fired {
        fired_kinds.insert(event.fault);
    }
}

/// What the fault schedule did.
pub(super) struct Schedule {
    /// Every fault, in order.
    pub timeline: Vec<FaultEvent>,
    /// Crash points that fired, per `service: point`.
    pub crash_points: BTreeMap<String, u32>,
    /// Duplicates injected (the rest is counted after the run).
    pub duplicates: Duplicates,
    /// When the clients had placed every order, since the load started.
    pub placing_ms: u64,
    /// Processes that exited without the schedule causing it, per
    /// `service: exit status` (each was started again, as an orchestrator
    /// would; any fails the run).
    pub unexpected_exits: BTreeMap<String, u32>,
}

/// Injects faults while the clients work, in the order and with the
/// choices of the seed's [`Plan`], until every kind fired — a crash-point
/// kind once each of its (service, point) pairs fired — and the clients are
/// done. Without traffic the crash points cannot fire: once the clients
/// are done, at most one more round runs, and what never fired is reported
/// as such (the run is then invalid).
pub(super) async fn run_schedule(
    stack: &mut Stack,
    client: &Client,
    cfg: &ChaosConfig,
    started: Instant,
    clients: &Clients,
) -> anyhow::Result<Schedule> {
    let mut timeline = Vec::new();
    let mut crash_points: BTreeMap<String, u32> = BTreeMap::new();
    let mut duplicates = Duplicates::default();
    let nodes = stack.broker_nodes().len() as u32;
    let kinds = Fault::kinds(nodes);
    let plan = Plan::new(cfg.seed, kinds.clone());
    let mut fired_kinds = BTreeSet::new();
    let mut left_after_clients: Option<usize> = None;
    let mut placing_ms = None;
    let mut open: Option<(usize, Window)> = None;
    let mut unexpected_exits = BTreeMap::new();
    for index in 0.. {
        tokio::time::sleep(plan.pause_before(index, cfg.fault_interval)).await;
        close_window(stack, &mut open, &mut timeline, &mut fired_kinds).await;
        end_windows(stack, client).await;
        restart_the_exited(stack, &mut unexpected_exits).await?;
        let clients_done = clients.placed_all();
        if clients_done && placing_ms.is_none() {
            placing_ms = Some(started.elapsed().as_millis() as u64);
        }
        if fired_kinds.len() == kinds.len() {
            clients.enough();
            if clients_done {
                break;
            }
        }
        if clients_done {
            let left = left_after_clients.get_or_insert(kinds.len());
            if *left == 0 {
                break;
            }
            *left -= 1;
        }
        let fault = plan.kind_at(index);
        let mut rng = plan.rng_for(index);
        let choice = choose(fault, &mut rng, nodes);
        let at_ms = started.elapsed().as_millis() as u64;
        let (detail, fired, window) = inject(
            stack,
            client,
            &mut rng,
            fault,
            choice,
            &mut crash_points,
            &mut duplicates,
        )
        .await?;
        if let Some(window) = window {
            open = Some((timeline.len(), window));
        }
        if cfg.progress {
            eprintln!("chaos: t={:>5.1}s fault {fault:?}: {detail}", at_ms as f64 / 1000.0);
        }
        // A crash-point kind is done once every process it arms has crashed
        // there (not one of three consumers): until then it comes again.
        if fired && (crash_points_of(fault).is_none() || every_pair_fired(fault, &crash_points)) {
            fired_kinds.insert(fault);
        }
        timeline.push(FaultEvent {
            at_ms,
            fault,
            detail,
            fired,
        });
    }
    restart_the_exited(stack, &mut unexpected_exits).await?;
    Ok(Schedule {
        timeline,
        crash_points,
        duplicates,
        placing_ms: placing_ms.unwrap_or_else(|| started.elapsed().as_millis() as u64),
        unexpected_exits,
    })
}

/// What an orchestrator does: a process that exited on its own (a fatal
/// error, not one of the schedule's faults, which restart what they end)
/// is started again — and counted, per service and exit status.
async fn restart_the_exited(stack: &mut Stack, exits: &mut BTreeMap<String, u32>) -> anyhow::Result<()> {
    for s in Service::ALL {
        if !stack.is_running(s) {
            let exit = stack
                .last_exit(s)
                .map_or_else(|| "no status".to_owned(), |e| e.to_string());
            eprintln!("chaos: {} exited on its own ({exit}); starting it again", s.name());
            *exits.entry(format!("{}: {exit}", s.name())).or_default() += 1;
            stack.start_service(s).await?;
        }
    }
    Ok(())
}

/// Ends the windowed faults (gateway faults, network mode, extra instances).
pub(super) async fn end_windows(stack: &mut Stack, client: &Client) {
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
    choice: Choice,
    crash_points: &mut BTreeMap<String, u32>,
    duplicates: &mut Duplicates,
) -> anyhow::Result<(String, bool, Option<Window>)> {
    if let Some(targets) = crash_points_of(fault) {
        let (detail, fired) = crash_at(stack, &targets, crash_points).await?;
        return Ok((detail, fired, None));
    }
    let gateway = stack.admin_url(Service::Gateway);
    let gateway_counter = |label| {
        let gateway = gateway.clone();
        async move {
            Stack::metric(&gateway, "gateway_injected_faults_total", &[("fault", label)])
                .await
                .unwrap_or(0.0)
        }
    };
    Ok(match fault {
        Fault::OrderApiAfterCommit
        | Fault::OrderApiBeforeCommit
        | Fault::RelayAfterPublish
        | Fault::PaymentAfterCharge
        | Fault::ConsumerBeforeOffsetCommit
        | Fault::ConsumerInTransaction => unreachable!("crash points are handled above"),
        Fault::RandomKill => {
            let Choice::Service(s) = choice else {
                anyhow::bail!("{fault:?} chose {choice:?}")
            };
            let restarted = stack.restart(s).await?;
            (
                format!("SIGKILL + restart {} ({restarted})", s.name()),
                restarted.evident(),
                None,
            )
        }
        Fault::BrokerRestart => {
            let Choice::Node(node) = choice else {
                anyhow::bail!("{fault:?} chose {choice:?}")
            };
            let restarted = stack.restart_broker_node(node).await?;
            (
                format!(
                    "SIGKILL + restart kafka node {node} of {} ({restarted})",
                    stack.broker_nodes().len()
                ),
                restarted.evident(),
                None,
            )
        }
        Fault::ServiceCutFromBrokers => {
            let Choice::Service(s) = choice else {
                anyhow::bail!("{fault:?} chose {choice:?}")
            };
            let (detail, fired) = partition::cut_service(stack, s).await?;
            (detail, fired, None)
        }
        Fault::KafkaNodeIsolated => {
            let Choice::Node(node) = choice else {
                anyhow::bail!("{fault:?} chose {choice:?}")
            };
            let (detail, fired) = partition::isolate_node(stack, node).await?;
            (detail, fired, None)
        }
        Fault::PostgresCrash => {
            let r = stack.crash_postgres(Duration::from_secs(3)).await?;
            let every = |v: &[Service]| v.len() == Service::ALL.len() - 1;
            let fired = r.evident() && every(&r.unready_while_down) && every(&r.ready_again);
            (format!("SIGKILL of PostgreSQL: {r}"), fired, None)
        }
        Fault::DatabaseConnectionsDropped => {
            let n = stack.terminate_db_connections().await?;
            (format!("pg_terminate_backend on {n} connections"), n > 0, None)
        }
        Fault::GatewayTimeoutAfterCommit => {
            let before = gateway_counter("timeout_after_commit").await;
            client
                .set_gateway_faults(serde_json::json!({"timeout_after_commit_rate": 0.3, "hang_ms": 1500}))
                .await?;
            (
                "gateway: 30 % commit-then-hang 1.5 s (client timeout 1 s)".into(),
                false,
                Some(Window::Gateway {
                    label: "timeout_after_commit",
                    before,
                }),
            )
        }
        Fault::Gateway5xxAndLatency => {
            let before = gateway_counter("fail_before_commit").await;
            client
                .set_gateway_faults(serde_json::json!({"fail_rate": 0.3, "latency_ms": 50}))
                .await?;
            (
                "gateway: 30 % 503 before commit, +50 ms".into(),
                false,
                Some(Window::Gateway {
                    label: "fail_before_commit",
                    before,
                }),
            )
        }
        Fault::NetworkFault => {
            let Choice::Network(mode) = choice else {
                anyhow::bail!("{fault:?} chose {choice:?}")
            };
            let proxy = stack
                .gateway_proxy()
                .ok_or_else(|| anyhow::anyhow!("no gateway proxy"))?;
            let before = proxy.acted();
            proxy.set(mode);
            (
                format!("payment → gateway: {mode:?}"),
                false,
                Some(Window::Network { before }),
            )
        }
        Fault::TwoConsumerInstances => {
            let a = stack.start_extra(Service::Inventory).await?;
            let b = stack.start_extra(Service::Payment).await?;
            (
                format!(
                    "second inventory-service (pid {}) and payment-service (pid {})",
                    a.0, b.0
                ),
                false,
                Some(Window::Extras { urls: vec![a, b] }),
            )
        }
        Fault::Rebalance => {
            let mut revokes_before = Vec::new();
            for s in [Service::Inventory, Service::Payment] {
                revokes_before.push((s, revocations(stack, s).await));
            }
            let a = stack.start_extra(Service::Inventory).await?;
            let b = stack.start_extra(Service::Payment).await?;
            (
                format!(
                    "inventory-service (pid {}) and payment-service (pid {}) join their groups, then leave",
                    a.0, b.0
                ),
                false,
                Some(Window::Rebalance {
                    revokes_before,
                    extras: vec![a, b],
                }),
            )
        }
        Fault::DuplicateInjection => {
            // Copies race the originals of orders in flight, in every run: a
            // copy that completes what a layer lost is counted as a rescue by
            // the audit (the inbox row names the copy it applied), not hidden.
            let (n, racing) = super::inject::duplicates(stack, rng, duplicates).await?;
            (
                format!("{n} messages re-produced with their event ids ({racing} of orders still in flight)"),
                n > 0,
                None,
            )
        }
    })
}
