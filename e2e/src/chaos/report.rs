//! What a run reports: the client view, the faults, the duplicates
//! delivered and absorbed, the audit — as JSON and as markdown.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use contract::topics::consumers;
use serde::Serialize;
use sqlx::Connection;
use uuid::Uuid;

use super::clients::ClientStats;
use super::faults::FaultEvent;
use super::plan::Kind;
use super::provenance::Log;
use crate::invariants::Audit;
use crate::stack::Stack;

/// A per-second sample of the run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub second: u64,
    /// Orders acknowledged so far.
    pub acknowledged: usize,
    /// Orders in the database not yet terminal.
    pub in_flight: i64,
}

/// Duplicate accounting.
#[derive(Debug, Default, Clone, Serialize, serde::Deserialize)]
#[serde(default)]
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
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Report {
    /// Seed.
    pub seed: u64,
    /// Orders planned.
    pub orders: usize,
    /// Negative control run.
    pub negative_control: bool,
    /// The layer switched off, if any: then the run must fail.
    pub layer_off: Option<super::LayerOff>,
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
    /// Processes that exited without a fault ending them, per `service:
    /// exit status` (the run fails on any).
    #[serde(default)]
    pub unexpected_exits: BTreeMap<String, u32>,
    /// The timeline.
    pub timeline: Vec<FaultEvent>,
    /// Per-second samples.
    pub samples: Vec<Sample>,
    /// Wall-clock time the load started (second 0 of the timeline).
    #[serde(default)]
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Duplicates delivered and absorbed.
    pub duplicates: Duplicates,
    /// Time from the last fault to a drained system.
    pub quiesce_ms: u64,
    /// Load duration.
    pub load_ms: u64,
    /// Arrival rate asked for, orders per second.
    pub rate_per_sec: f64,
    /// Concurrent clients.
    pub clients_n: usize,
    /// Pause between faults, milliseconds.
    pub fault_interval_ms: u64,
    /// Orders acknowledged per second while the clients were placing them
    /// (retries after faults included, so the last faults stretch it).
    pub placed_per_sec: f64,
    /// Orders whose first attempt the clients sent per second: the arrival
    /// rate the system was offered.
    #[serde(default)]
    pub offered_per_sec: f64,
    /// The invariant audit.
    pub audit: Audit,
    /// Dead letters per dead-letter topic, read back from the broker: each
    /// one a violation in a run that poisons nothing on purpose.
    #[serde(default)]
    pub dead_letters: BTreeMap<String, usize>,
    /// Why the run is not a valid one, whatever its verdict: a fault kind or
    /// a (service, crash point) pair that never fired, no duplicate
    /// delivered, less load offered than asked. Each is in `problems` too;
    /// a run with a layer off must have none of them to count as caught.
    #[serde(default)]
    pub invalid: Vec<String>,
    /// Reasons the run does not count or failed (empty: passed).
    pub problems: Vec<String>,
}

impl Report {
    /// Whether every invariant held and the faults really happened.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// The invariants named by the problems of this run, each with how
    /// many problems named it.
    pub fn broken(&self) -> BTreeMap<&'static str, usize> {
        use crate::invariants::*;
        let mut out = BTreeMap::new();
        for p in &self.problems {
            for name in [
                ORDER_PER_KEY,
                CHARGED_ONCE,
                STOCK_CONSERVED,
                STEP_ONCE,
                NOTHING_LOST,
                NOTHING_STUCK,
            ] {
                if p.starts_with(name) {
                    *out.entry(name).or_default() += 1;
                }
            }
        }
        out
    }

    /// For a run with a layer off: whether it broke the invariant it must.
    pub fn caught(&self) -> Option<bool> {
        let layer = self.layer_off?;
        Some(layer.caught_in(&self.audit))
    }

    /// Whether the run's schedule was a valid one ([`Report::invalid`] empty).
    pub fn valid(&self) -> bool {
        self.invalid.is_empty()
    }
}

/// Reads every topic back whole (a partial read is an error), counts the
/// duplicate copies in the broker's log (per topic) and the redeliveries
/// each consumer's inbox absorbed (its durable count); returns the log.
pub(super) async fn count_duplicates(stack: &Stack, d: &mut Duplicates) -> anyhow::Result<Log> {
    let mut log = Log::default();
    for topic in contract::topics::ALL {
        log.add(topic, &read_back(stack, topic, Duration::from_secs(5)).await?);
    }
    d.in_log = log.duplicates_per_topic();
    for topic in contract::topics::ALL {
        d.in_log.entry(topic.to_owned()).or_default();
    }
    for (db, consumer) in [
        ("orders", consumers::ORDER_SAGA.name),
        ("inventory", consumers::INVENTORY.name),
        ("payments", consumers::PAYMENT.name),
    ] {
        let mut c = sqlx::PgConnection::connect(&stack.db_url(db)).await?;
        let n: i64 = sqlx::query_scalar("SELECT COALESCE(sum(redeliveries), 0)::int8 FROM inbox_redeliveries")
            .fetch_one(&mut c)
            .await?;
        d.absorbed.insert(consumer.to_owned(), n);
    }
    Ok(log)
}

/// `topic` read back whole (a partial read is an error) by a group of its
/// own, done reading after `idle` without a message.
async fn read_back(stack: &Stack, topic: &str, idle: Duration) -> anyhow::Result<Vec<rdkafka::message::OwnedMessage>> {
    let (b, t, group) = (
        stack.kafka(),
        topic.to_owned(),
        format!("chaos-audit-{}", Uuid::new_v4()),
    );
    Ok(tokio::task::spawn_blocking(move || kafka::read_whole_topic(&b, &t, &group, idle)).await??)
}

/// The dead letters of every saga topic, read back whole: per dead-letter
/// topic, how many, and the first few described by their headers.
pub(super) async fn dead_letters(stack: &Stack) -> anyhow::Result<(BTreeMap<String, usize>, Vec<String>)> {
    use rdkafka::message::Headers as _;
    use rdkafka::Message as _;
    let (mut counts, mut described) = (BTreeMap::new(), Vec::new());
    for topic in contract::topics::ALL {
        let dlt = kafka::client::dead_letter_topic(topic);
        let messages = read_back(stack, &dlt, Duration::from_secs(3)).await?;
        for m in messages.iter().take(5usize.saturating_sub(described.len())) {
            let headers: Vec<String> = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| format!("{}={}", h.key, String::from_utf8_lossy(h.value.unwrap_or_default())))
                        .collect()
                })
                .unwrap_or_default();
            described.push(format!(
                "{dlt} {}:{} [{}]",
                m.partition(),
                m.offset(),
                headers.join(", ")
            ));
        }
        counts.insert(dlt, messages.len());
    }
    Ok((counts, described))
}

/// Acknowledged orders per intended kind and final status.
pub(super) async fn outcomes(
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

/// Each acknowledged order against what its kind must become, read from
/// the orders and the ledger: payable → CONFIRMED (CANCELLED only after a
/// cancel the client sent), declined → CANCELLED and never captured, out of
/// stock → CANCELLED and never charged at all.
pub(super) async fn wrong_outcomes(
    stack: &Stack,
    acked: &BTreeMap<String, (Uuid, Kind)>,
    stats: &ClientStats,
) -> anyhow::Result<Vec<String>> {
    let mut c = sqlx::PgConnection::connect(&stack.db_url("orders")).await?;
    let status: BTreeMap<Uuid, String> = sqlx::query_as::<_, (Uuid, String)>("SELECT id, status FROM orders")
        .fetch_all(&mut c)
        .await?
        .into_iter()
        .collect();
    let mut g = sqlx::PgConnection::connect(&stack.db_url("gateway")).await?;
    let ledger: Vec<(Uuid, String, String)> = sqlx::query_as("SELECT order_id, kind, status FROM ledger")
        .fetch_all(&mut g)
        .await?;
    let captured = |id: &Uuid| {
        ledger
            .iter()
            .any(|(o, k, s)| o == id && k == "charge" && s == "captured")
    };
    let charged = |id: &Uuid| ledger.iter().any(|(o, ..)| o == id);
    let mut wrong: BTreeMap<String, Vec<Uuid>> = BTreeMap::new();
    for (id, kind) in acked.values() {
        let s = status.get(id).map_or("MISSING", String::as_str);
        let why = match kind {
            Kind::Payable if s == "CONFIRMED" => None,
            Kind::Payable if s == "CANCELLED" && stats.cancelled.contains(id) => None,
            Kind::Payable if s == "CANCELLED" && stats.cancel_unanswered.contains(id) => None,
            Kind::Payable => Some("payable, not CONFIRMED and no cancel sent"),
            Kind::Declined if s != "CANCELLED" => Some("declined, not CANCELLED"),
            Kind::Declined if captured(id) => Some("declined, yet captured"),
            Kind::OutOfStock if s != "CANCELLED" => Some("out of stock, not CANCELLED"),
            Kind::OutOfStock if charged(id) => Some("out of stock, yet charged"),
            _ => None,
        };
        if let Some(why) = why {
            wrong.entry(why.to_owned()).or_default().push(*id);
        }
    }
    for id in &stats.cancelled {
        if status.get(id).map(String::as_str) != Some("CANCELLED") {
            wrong
                .entry("cancel acknowledged, not CANCELLED".into())
                .or_default()
                .push(*id);
        }
    }
    Ok(wrong
        .into_iter()
        .map(|(why, ids)| {
            format!(
                "{}: {} orders {why} (first: {})",
                crate::invariants::NOTHING_LOST,
                ids.len(),
                ids[0]
            )
        })
        .collect())
}

/// The human report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let verdict = match (
        r.negative_control,
        r.audit.double_charged.is_empty(),
        r.passed(),
        r.layer_off,
    ) {
        (true, false, ..) => "NEGATIVE CONTROL: double charges found, as they must be".to_owned(),
        (true, true, ..) => "NEGATIVE CONTROL FAILED: no double charge found".to_owned(),
        (false, _, _, Some(layer)) => match r.caught() {
            Some(true) => format!(
                "{} OFF: caught — \"{}\" broke, as it must",
                layer.name(),
                layer.expected().invariant
            ),
            _ => format!(
                "{} OFF: NOT CAUGHT — \"{}\" held",
                layer.name(),
                layer.expected().invariant
            ),
        },
        (false, _, true, None) => "PASSED".to_owned(),
        (false, _, false, None) => "FAILED".to_owned(),
    };
    let _ = writeln!(s, "# Chaos run — seed {} — {verdict}\n", r.seed);
    let _ = writeln!(
        s,
        "Replay with `cargo xtask chaos --orders {} --seed {} --rate {} --clients {} --fault-interval-ms {}`{}.\n",
        r.orders,
        r.seed,
        r.rate_per_sec,
        r.clients_n,
        r.fault_interval_ms,
        match (r.negative_control, r.layer_off) {
            (true, _) => " --negative-control".to_owned(),
            (false, Some(layer)) => format!(" --layer-off {}", layer.name()),
            (false, None) => String::new(),
        }
    );
    if let Some(layer) = r.layer_off {
        let e = layer.expected();
        let _ = writeln!(s, "## Layer off\n");
        let _ = writeln!(
            s,
            "| layer off | invariant that must break | the effect that shows it | seen | why | broken (problems naming it) |\n|---|---|---|---|---|---|"
        );
        let broken: Vec<String> = r.broken().iter().map(|(k, n)| format!("{k} ({n})")).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |\n",
            layer.name(),
            e.invariant,
            e.effect,
            if r.caught() == Some(true) { "yes" } else { "NO" },
            e.why,
            broken.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "![orders per second, open orders and faults over the run](report.svg)\n"
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
        "| offered / acknowledged per second (asked {}) / load / time to quiesce | {:.1} / {:.1} / {:.1} s / {:.1} s |",
        r.rate_per_sec,
        r.offered_per_sec,
        r.placed_per_sec,
        r.load_ms as f64 / 1000.0,
        r.quiesce_ms as f64 / 1000.0
    );
    let _ = writeln!(s, "\nBy intended kind → final status: {:?}\n", r.outcomes);
    let _ = writeln!(s, "## HTTP layer\n");
    let c = &r.clients;
    let _ = writeln!(s, "retries with the same key {}, of which answered by a replay {}, 409 in flight {}, deliberate re-sends {}, cancels {}, 201s that were not an order {}\n", c.retries, c.replays, c.in_flight_409, c.resends, c.cancels, c.unparsable_201);
    let _ = writeln!(s, "## Faults\n");
    let _ = writeln!(s, "kills per service: {:?}\n", r.kills);
    let _ = writeln!(s, "crash points fired: {:?}\n", r.crash_points);
    let _ = writeln!(s, "exits no fault caused (must be none): {:?}\n", r.unexpected_exits);
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
        "duplicate effects: {} double charges in the gateway ledger; {} gateway keys with two ledger entries; \
         {} replies applied twice by the saga (order_history); {} events answered twice in the log (one cause, \
         two events of a type); events that passed an inbox and reached an effect again (caught by a business key): {:?}\n",
        r.audit.double_charged.len(),
        r.audit.ledger_keys_repeated,
        r.audit.replies_applied_twice,
        r.audit.events_answered_twice,
        r.audit.inbox_misses
    );
    if !r.audit.late_not_lost.is_empty() {
        let per: BTreeMap<&str, usize> = r
            .audit
            .late_not_lost
            .iter()
            .map(|(c, o)| (c.as_str(), o.len()))
            .collect();
        let _ = writeln!(
            s,
            "## Late, not lost\n\nOrders the deadline reconciler acted on while the first copy of the message it \
             stood in for was still on its way — a command re-sent (in the log, or waiting in the outbox, \
             before the re-send; its consumer applied the first copy and absorbed the re-sent one), or a reply reconciled from its sender's record (the reply arrived after, \
             and its first copy was applied as a no-op): {per:?}\n"
        );
    }
    let _ = writeln!(
        s,
        "## Lost before the log\n\nOutbox rows marked published against the broker's append time of their first \
         copy, and re-sent commands against the log and the outbox: {} lost\n",
        r.audit.lost_before_the_log
    );
    for row in &r.audit.lost_before_the_log_evidence {
        let _ = writeln!(s, "- {row}");
    }
    if !r.audit.lost_before_the_log_evidence.is_empty() {
        let _ = writeln!(s);
    }
    let a = &r.audit;
    let _ = writeln!(
        s,
        "## Events against their inboxes and effects\n\nevents in the log no inbox holds {}; inbox rows without \
         their effect {}; effects without an inbox row {}; inbox rows naming no copy {}; events applied from a \
         later copy {}; dead letters {:?}\n",
        a.never_handled,
        a.handled_without_effect,
        a.effect_without_inbox,
        a.inbox_without_source,
        a.applied_from_later_copy,
        r.dead_letters
    );
    for row in &a.effects_evidence {
        let _ = writeln!(s, "- {row}");
    }
    if !a.effects_evidence.is_empty() {
        let _ = writeln!(s);
    }
    if let Some(layer) = r.layer_off {
        let _ = writeln!(
            s,
            "## Caught\n\n{} off, caught by: {:?}; schedule valid: {} {:?}\n",
            layer.name(),
            layer.caught_by(a),
            r.valid(),
            r.invalid
        );
    }
    let _ = writeln!(s, "## Rescued by the deadline reconciler\n");
    if r.audit.rescued.is_empty() {
        let _ = writeln!(s, "none: every order finished on its own messages\n");
    } else {
        let _ = writeln!(s, "| action (history cause) | orders |\n|---|---:|");
        for (cause, orders) in &r.audit.rescued {
            let _ = writeln!(s, "| {cause} | {} |", orders.len());
        }
        let _ = writeln!(s, "\nhistory rows (first {}):\n", r.audit.rescue_evidence.len());
        for row in &r.audit.rescue_evidence {
            let _ = writeln!(s, "- {row}");
        }
        let _ = writeln!(s);
    }
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
