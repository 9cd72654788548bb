//! `cargo xtask bench --overload CAPACITY`: the API past its capacity.
//!
//! Careful clients — each order under one Idempotency-Key, retried on a
//! 503, 409, 5xx or a 2-s timeout after `Retry-After` and an exponential
//! backoff with full jitter (1 s doubling to 16 s), given up after 120 s —
//! arrive at half the capacity for 15 s (the baseline), at three times it
//! for 60 s (the overload), then at half again for 30 s (the recovery).
//! An API that admits everything collapses here: requests queue for the
//! database beyond the clients' timeouts, every retry joins the queue, and
//! goodput falls to a fraction of capacity. With admission control
//! (`order-api`'s `http::admission`) the overload's excess is refused at
//! once, and what is admitted is served in time.
//!
//! The verdict, per the case's goals: goodput (orders acknowledged per
//! second, each once) at least 90 % of capacity in every 5-s window of
//! the overload after its first; the accepted requests' p99 bounded (under
//! the clients' timeout); no transaction cut mid-way (PostgreSQL's log:
//! "there is already a transaction in progress"); and within 10 s of the
//! overload's end, the per-second p99 back near the baseline's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng as _;
use serde::Serialize;

use super::mix::Load;

/// A client's timeout per request.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client keeps retrying one order.
pub const GIVE_UP: Duration = Duration::from_secs(120);
/// The overload: this many times the capacity.
pub const FACTOR: f64 = 3.0;
/// The phases: name, share of capacity, seconds.
pub const PHASES: [(&str, f64, u64); 3] = [("baseline", 0.5, 15), ("overload", FACTOR, 60), ("recovery", 0.5, 30)];
/// Goodput in each 5-s window of the overload after its first, at least this share of capacity.
pub const GOODPUT_GOAL: f64 = 0.9;
/// The overload's end to a p99 near the baseline's, at most.
pub const RECOVERY_GOAL: Duration = Duration::from_secs(10);
/// PostgreSQL's warning for a BEGIN on a connection whose transaction a
/// cancelled request left open.
const CUT_TRANSACTION: &str = "there is already a transaction in progress";

/// One second of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Second {
    /// Seconds since the start.
    pub t: u64,
    /// Its phase.
    pub phase: &'static str,
    /// New orders arriving.
    pub arrivals: usize,
    /// Requests sent (first tries and retries).
    pub requests: usize,
    /// Orders acknowledged (their first 201), by when it came.
    pub acknowledged: usize,
    /// 503s.
    pub refused: usize,
    /// Timeouts and connection errors.
    pub timeouts: usize,
    /// Other answers (409, 429, other 5xx).
    pub other: usize,
    /// p99 of the 201 answers' latencies this second, ms.
    pub p99_ms: f64,
}

/// The case's figures and verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Overload {
    /// When, RFC 3339.
    pub date: String,
    /// The machine, in words.
    pub machine: String,
    /// The capacity the case was run against (orders/s, from a search).
    pub capacity: f64,
    /// Second by second.
    pub seconds: Vec<Second>,
    /// The lowest goodput of a 5-s window of the overload after its first, orders/s.
    pub overload_goodput_min: f64,
    /// p99 of every accepted request's latency in the overload, ms.
    pub overload_accepted_p99_ms: f64,
    /// p99 of the baseline's accepted requests, ms.
    pub baseline_p99_ms: f64,
    /// Seconds from the overload's end until every later second of the
    /// recovery phase had its p99 within twice the baseline's (+ 50 ms);
    /// `None`: never.
    pub recovery_secs: Option<u64>,
    /// Seconds from the overload's end until the clients' backlog — orders
    /// arrived and not yet acknowledged — fell to one second of capacity:
    /// careful clients keep retrying what the overload refused, so the
    /// offered load stays above capacity until then (`None`: never).
    pub backlog_secs: Option<u64>,
    /// Seconds from the backlog's end until every later second's p99 was
    /// near the baseline (`None`: never, or the backlog never drained).
    pub recovery_after_backlog_secs: Option<u64>,
    /// Transactions cut mid-way (PostgreSQL's warnings during the run;
    /// `None`: its log could not be read).
    pub cut_transactions: Option<usize>,
    /// Orders whose client gave up after [`GIVE_UP`].
    pub given_up: usize,
    /// Orders refused for good (a 4xx other than 409 and 429).
    pub rejected: usize,
    /// CPU seconds per process over the run.
    pub cpu_secs: BTreeMap<String, f64>,
    /// Every goal met.
    pub passed: bool,
    /// The goals missed, in words.
    pub missed: Vec<String>,
}

/// What the clients recorded.
#[derive(Default)]
struct Log {
    seconds: Vec<Second>,
    /// (second, latency ms) of each 201.
    accepted: Vec<(u64, f64)>,
    given_up: usize,
    rejected: usize,
}

impl Log {
    fn at(&mut self, t: u64) -> &mut Second {
        while self.seconds.len() as u64 <= t {
            let n = self.seconds.len() as u64;
            self.seconds.push(Second {
                t: n,
                phase: phase_at(n),
                ..Second::default()
            });
        }
        &mut self.seconds[t as usize]
    }
}

/// The phase second `t` belongs to.
fn phase_at(t: u64) -> &'static str {
    let mut end = 0;
    for (name, _, secs) in PHASES {
        end += secs;
        if t < end {
            return name;
        }
    }
    "after"
}

/// One careful client: `order` under one key until a 201, a final refusal
/// or [`GIVE_UP`].
async fn careful(
    client: crate::driver::Client,
    order: crate::driver::OrderRequest,
    start: Instant,
    log: Arc<Mutex<Log>>,
) {
    let key = uuid::Uuid::new_v4().to_string();
    let first = Instant::now();
    let mut backoff = Duration::from_secs(1);
    loop {
        let sent = Instant::now();
        let answer = client.post_order(&key, &order).await;
        let (t, ms) = (start.elapsed().as_secs(), sent.elapsed().as_secs_f64() * 1e3);
        {
            let mut log = log.lock().expect("log");
            log.at(sent.duration_since(start).as_secs()).requests += 1;
            match &answer {
                Ok(p) if p.status == 201 => {
                    log.at(t).acknowledged += 1;
                    log.accepted.push((t, ms));
                    return;
                }
                Ok(p) if p.status == 503 => log.at(t).refused += 1,
                Ok(p) if matches!(p.status, 409 | 429) || p.status >= 500 => log.at(t).other += 1,
                Ok(_) => {
                    log.rejected += 1;
                    return;
                }
                Err(_) => log.at(t).timeouts += 1,
            }
        }
        if first.elapsed() >= GIVE_UP {
            log.lock().expect("log").given_up += 1;
            return;
        }
        // Retry-After (1 s) at least, then full jitter over the backoff.
        let jitter = rand::thread_rng().gen_range(0.0..backoff.as_secs_f64());
        tokio::time::sleep(Duration::from_secs(1) + Duration::from_secs_f64(jitter)).await;
        backoff = (backoff * 2).min(Duration::from_secs(16));
    }
}

/// The p99 of `ms` (0 when empty).
fn p99(ms: &mut [f64]) -> f64 {
    if ms.is_empty() {
        return 0.0;
    }
    ms.sort_by(f64::total_cmp);
    ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1]
}

/// Runs the case against `capacity` orders/s on `load`'s stack.
pub async fn run(load: &Load, orders_db: &str, capacity: f64) -> anyhow::Result<Overload> {
    let log = Arc::new(Mutex::new(Log::default()));
    let pg_log = testkit::postgres::log_file();
    let pg_log_from = pg_log.as_ref().and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len());
    let cpu_before = testkit::process::cpu_seconds_by_command();
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    let mut due = Duration::ZERO;
    let mut i = 0;
    for (name, share, secs) in PHASES {
        let rate = capacity * share;
        eprintln!("overload: {name}: {rate:.0} orders/s for {secs} s");
        let end = due + Duration::from_secs(secs);
        while due < end {
            tokio::time::sleep_until((start + due).into()).await;
            let (client, order, _) = load.order(i);
            log.lock().expect("log").at(due.as_secs()).arrivals += 1;
            clients.spawn(careful(client.clone(), order, start, log.clone()));
            i += 1;
            due += Duration::from_secs_f64(1.0 / rate);
        }
    }
    while clients.join_next().await.is_some() {}
    let cpu_after = testkit::process::cpu_seconds_by_command();
    super::load::wait_drained(orders_db, Duration::from_secs(300)).await?;
    let cut_transactions = pg_log.as_ref().zip(pg_log_from).and_then(|(path, from)| {
        let text = std::fs::read(path).ok()?;
        let added = String::from_utf8_lossy(&text[(from as usize).min(text.len())..]).into_owned();
        Some(added.matches(CUT_TRANSACTION).count())
    });
    let log = std::mem::take(&mut *log.lock().expect("log"));
    Ok(verdict(
        log,
        capacity,
        cut_transactions,
        cpu_delta(&cpu_before, &cpu_after),
    ))
}

fn cpu_delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.05)
        .collect()
}

/// The figures and the verdict from what the clients recorded.
fn verdict(log: Log, capacity: f64, cut_transactions: Option<usize>, cpu_secs: BTreeMap<String, f64>) -> Overload {
    let (baseline_end, overload_end) = (PHASES[0].2, PHASES[0].2 + PHASES[1].2);
    let lat = |from: u64, to: u64| -> Vec<f64> {
        log.accepted
            .iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|(_, ms)| *ms)
            .collect()
    };
    let baseline_p99_ms = p99(&mut lat(0, baseline_end));
    let overload_accepted_p99_ms = p99(&mut lat(baseline_end, overload_end));
    let mut seconds = log.seconds;
    for s in &mut seconds {
        s.p99_ms = p99(&mut lat(s.t, s.t + 1));
    }
    let windows: Vec<f64> = (baseline_end + 5..overload_end)
        .step_by(5)
        .map(|from| {
            let n: usize = (from..(from + 5).min(overload_end))
                .filter_map(|t| seconds.get(t as usize))
                .map(|s| s.acknowledged)
                .sum();
            n as f64 / 5.0
        })
        .collect();
    let overload_goodput_min = windows.iter().copied().fold(f64::INFINITY, f64::min);
    let near = (2.0 * baseline_p99_ms).max(baseline_p99_ms + 50.0);
    let recovery: Vec<&Second> = seconds.iter().filter(|s| s.phase == "recovery").collect();
    let recovered_from = (0..recovery.len()).find(|&k| recovery[k..].iter().all(|s| s.p99_ms <= near));
    let recovery_secs = recovered_from.map(|k| k as u64);
    let (backlog_secs, recovery_after_backlog_secs) = after_backlog(&seconds, overload_end, capacity, near);
    let mut missed = Vec::new();
    if overload_goodput_min < GOODPUT_GOAL * capacity {
        missed.push(format!(
            "goodput fell to {overload_goodput_min:.0}/s in a 5-s window (goal ≥ {:.0}/s)",
            GOODPUT_GOAL * capacity
        ));
    }
    if overload_accepted_p99_ms >= CLIENT_TIMEOUT.as_secs_f64() * 1e3 {
        missed.push(format!(
            "accepted p99 {overload_accepted_p99_ms:.0} ms, not under the clients' {} s timeout",
            CLIENT_TIMEOUT.as_secs()
        ));
    }
    match cut_transactions {
        Some(0) => {}
        Some(n) => missed.push(format!("{n} transactions cut mid-way (PostgreSQL's log)")),
        None => missed.push("PostgreSQL's log could not be read: cut transactions not counted".into()),
    }
    // The overload ends when the offered load does: at the phase's end, or
    // — with clients retrying what it refused — once their backlog drained.
    let within = |s: Option<u64>| s.is_some_and(|s| s <= RECOVERY_GOAL.as_secs());
    if !within(recovery_secs) && !within(recovery_after_backlog_secs) {
        missed.push(format!(
            "p99 not back within {} s of the overload's end ({recovery_secs:?}) nor of its backlog's ({recovery_after_backlog_secs:?})",
            RECOVERY_GOAL.as_secs()
        ));
    }
    if log.given_up > 0 {
        missed.push(format!(
            "{} orders never acknowledged within {} s",
            log.given_up,
            GIVE_UP.as_secs()
        ));
    }
    Overload {
        date: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        machine: super::machine(),
        capacity,
        overload_goodput_min,
        overload_accepted_p99_ms,
        baseline_p99_ms,
        recovery_secs,
        backlog_secs,
        recovery_after_backlog_secs,
        cut_transactions,
        given_up: log.given_up,
        rejected: log.rejected,
        cpu_secs,
        passed: missed.is_empty(),
        missed,
        seconds,
    }
}

/// When the clients' backlog drained after the overload's end (seconds
/// after it), and how long from then until every later second's p99 was
/// within `near`.
fn after_backlog(seconds: &[Second], overload_end: u64, capacity: f64, near: f64) -> (Option<u64>, Option<u64>) {
    let mut outstanding = 0i64;
    let mut drained = None;
    for s in seconds {
        outstanding += s.arrivals as i64 - s.acknowledged as i64;
        if s.t >= overload_end && outstanding as f64 <= capacity {
            drained = Some(s.t);
            break;
        }
    }
    let Some(at) = drained else {
        return (None, None);
    };
    let later: Vec<&Second> = seconds.iter().filter(|s| s.t >= at).collect();
    let recovered = (0..later.len()).find(|&k| later[k..].iter().all(|s| s.p99_ms <= near));
    (Some(at - overload_end), recovered.map(|k| k as u64))
}

/// The case as markdown: the verdict, then second by second.
pub fn markdown(o: &Overload) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Overload — {}\n\n{}\n", o.date, o.machine);
    let _ = writeln!(
        s,
        "Capacity {:.0} orders/s; {:.0}/s for {} s, {:.0}/s for {} s, {:.0}/s for {} s; careful clients (one key per order, {} s timeout, Retry-After and jittered backoff, given up after {} s).\n",
        o.capacity,
        o.capacity * PHASES[0].1,
        PHASES[0].2,
        o.capacity * PHASES[1].1,
        PHASES[1].2,
        o.capacity * PHASES[2].1,
        PHASES[2].2,
        CLIENT_TIMEOUT.as_secs(),
        GIVE_UP.as_secs()
    );
    let _ = writeln!(s, "| figure | value | goal |\n|---|---:|---|");
    let _ = writeln!(
        s,
        "| lowest goodput of a 5-s window in the overload | {:.0}/s ({:.0} %) | ≥ {:.0} % of capacity |",
        o.overload_goodput_min,
        100.0 * o.overload_goodput_min / o.capacity,
        100.0 * GOODPUT_GOAL
    );
    let _ = writeln!(
        s,
        "| accepted requests' p99 in the overload | {:.0} ms | under {} s |",
        o.overload_accepted_p99_ms,
        CLIENT_TIMEOUT.as_secs()
    );
    let _ = writeln!(s, "| baseline p99 | {:.0} ms | |", o.baseline_p99_ms);
    let _ = writeln!(
        s,
        "| overload's end → p99 near the baseline | {} | ≤ {} s |",
        o.recovery_secs.map_or("never".into(), |r| format!("{r} s")),
        RECOVERY_GOAL.as_secs()
    );
    let _ = writeln!(
        s,
        "| overload's end → the clients' backlog drained | {} | |",
        o.backlog_secs.map_or("never".into(), |r| format!("{r} s"))
    );
    let _ = writeln!(
        s,
        "| backlog drained → p99 near the baseline | {} | ≤ {} s (either this or the row above it) |",
        o.recovery_after_backlog_secs
            .map_or("never".into(), |r| format!("{r} s")),
        RECOVERY_GOAL.as_secs()
    );
    let _ = writeln!(
        s,
        "| transactions cut mid-way | {} | 0 |",
        o.cut_transactions.map_or("not read".into(), |n| n.to_string())
    );
    let _ = writeln!(
        s,
        "| orders given up / refused for good | {} / {} | 0 / 0 |",
        o.given_up, o.rejected
    );
    let _ = writeln!(
        s,
        "\n**{}**{}\n",
        if o.passed { "Passed" } else { "Not passed" },
        if o.missed.is_empty() {
            String::new()
        } else {
            format!(": {}", o.missed.join("; "))
        }
    );
    let cpu: Vec<String> = o.cpu_secs.iter().map(|(k, v)| format!("{k} {v:.1} s")).collect();
    let _ = writeln!(s, "CPU over the run: {}\n", cpu.join(", "));
    let _ = writeln!(
        s,
        "| s | phase | arrivals | requests | acknowledged | 503 | timeouts | other | p99 ms |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for x in &o.seconds {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
            x.t, x.phase, x.arrivals, x.requests, x.acknowledged, x.refused, x.timeouts, x.other, x.p99_ms
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(t: u64, acknowledged: usize) -> Second {
        Second {
            t,
            phase: phase_at(t),
            acknowledged,
            ..Second::default()
        }
    }

    #[test]
    fn goodput_below_goal_or_a_slow_recovery_fails_the_case() {
        let run = |ack_in_overload: usize, late_ms: f64| {
            let mut log = Log::default();
            for t in 0..105 {
                let ack = if phase_at(t) == "overload" { ack_in_overload } else { 50 };
                *log.at(t) = second(t, ack);
                let ms = if phase_at(t) == "recovery" && t < 90 {
                    late_ms
                } else {
                    20.0
                };
                log.accepted.extend((0..ack).map(|_| (t, ms)));
            }
            verdict(log, 100.0, Some(0), BTreeMap::new())
        };
        let good = run(95, 20.0);
        assert!(good.passed, "{:?}", good.missed);
        assert_eq!(good.recovery_secs, Some(0));
        let collapsed = run(60, 20.0);
        assert!(!collapsed.passed);
        assert!(collapsed.missed[0].contains("goodput"), "{:?}", collapsed.missed);
        // 15 s of slow answers after the overload: recovered only at 15 s.
        let slow = run(95, 900.0);
        assert_eq!(slow.recovery_secs, Some(15));
        assert!(!slow.passed);
        // Slow until the clients' backlog drained, then fast at once: passed,
        // measured from the backlog's end. Slow after it too: not passed.
        let backlog = |slow_after: bool| {
            let mut log = Log::default();
            for t in 0..140 {
                let (arrivals, ack) = match phase_at(t) {
                    "overload" => (300, 95),
                    "after" => (0, if t < 120 { 600 } else { 50 }),
                    _ => (50, if t < 60 { 50 } else { 200 }),
                };
                *log.at(t) = Second {
                    arrivals,
                    ..second(t, ack)
                };
                let slow = (75..120).contains(&t) || (slow_after && (75..135).contains(&t));
                let ms = if slow { 900.0 } else { 20.0 };
                log.accepted.extend((0..ack).map(|_| (t, ms)));
            }
            verdict(log, 100.0, Some(0), BTreeMap::new())
        };
        let drained = backlog(false);
        assert_eq!(drained.recovery_secs, None);
        assert_eq!(drained.backlog_secs, Some(42), "drained at 117 s");
        assert_eq!(drained.recovery_after_backlog_secs, Some(3));
        assert!(drained.passed, "{:?}", drained.missed);
        let still_slow = backlog(true);
        assert!(!still_slow.passed, "{:?}", still_slow.recovery_after_backlog_secs);
        let mut cut = run(95, 20.0);
        cut = verdict(
            Log {
                seconds: cut.seconds.clone(),
                accepted: cut
                    .seconds
                    .iter()
                    .flat_map(|s| (0..s.acknowledged).map(move |_| (s.t, 20.0)))
                    .collect(),
                ..Log::default()
            },
            100.0,
            Some(2),
            BTreeMap::new(),
        );
        assert!(cut.missed.iter().any(|m| m.contains("cut mid-way")), "{:?}", cut.missed);
    }

    #[test]
    fn the_phases_follow_each_other() {
        assert_eq!(phase_at(0), "baseline");
        assert_eq!(phase_at(15), "overload");
        assert_eq!(phase_at(74), "overload");
        assert_eq!(phase_at(75), "recovery");
        assert_eq!(phase_at(105), "after");
    }
}
