//! The capacity search: open-loop trials at fixed arrival rates, up by half
//! while they hold, then bisection between the highest rate that held and
//! the lowest that did not until the two are within [`RESOLUTION`] of each
//! other, and both of those decisive rates repeated until each has
//! [`REPEATS`] trials; a rate's verdict is its trials' majority.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::load::{self, Percentiles};
use super::mix::Load;
use super::{cpu_per_order, PgCounters, PgPerOrder};
use crate::stack::{Service, Stack};

/// The search stops when the lowest failing rate is within this fraction
/// above the highest sustained one: the capacity lies between them, so the
/// figure is known to ± half of it.
pub const RESOLUTION: f64 = 0.10;
/// Trials of each decisive rate.
pub const REPEATS: usize = 3;
/// Completions must keep up with arrivals: the orders terminal when the
/// last one had been answered, over those placed, at least this.
pub const MIN_COMPLETED: f64 = 0.95;

/// One sustained-rate trial.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// Arrival rate, orders per second.
    pub rate: f64,
    /// Orders acknowledged.
    pub placed: usize,
    /// Requests refused or failed.
    pub failed: usize,
    /// Orders acknowledged per second, from the first intended send until
    /// the last order was answered (longer than the window when the intake
    /// fell behind).
    pub arrivals_per_sec: f64,
    /// Orders of the trial terminal by the time its last order had been
    /// answered, per second of the same span.
    pub completed_per_sec: f64,
    /// Backlog (orders not terminal) at mid-window.
    pub backlog_mid: i64,
    /// Backlog at the end of the window.
    pub backlog_end: i64,
    /// Backlog growth: mean of the last quarter of the window minus mean of
    /// the second quarter.
    pub backlog_growth: f64,
    /// Sustained: every order sent within [`load::MAX_SEND_LAG`], none
    /// failed, completions per second at least [`MIN_COMPLETED`] of
    /// arrivals, the backlog grew by at most half a second of arrivals (or
    /// 20) from the second to the last quarter of the window, and it
    /// drained; and so did every queue behind it ([`Trial::queues`]).
    pub sustained: bool,
    /// The outboxes, the notices and the consumer groups' lag, second by
    /// second ([`super::queues`]).
    pub queues: super::queues::Queues,
    /// The queues that grew or did not empty (empty: none).
    pub queues_behind: Vec<String>,
    /// Orders sent per second (all, over the time to send the last).
    pub offered_per_sec: f64,
    /// How late the most delayed order was sent, in seconds.
    pub send_lag_secs: f64,
    /// Placed → terminal of the trial's orders not cancelled by the driver.
    pub latency: Percentiles,
    /// Cancels accepted, and not (409: not yet CONFIRMED, or an error).
    pub cancels: usize,
    /// Cancels not accepted.
    pub cancels_failed: usize,
    /// The backlog, second by second.
    pub backlog: Vec<i64>,
    /// CPU milliseconds per order, per process (over the window).
    pub cpu_ms_per_order: BTreeMap<String, f64>,
    /// PostgreSQL's share of it split by whom it worked for (over the
    /// window; [`super::pg_cpu`]).
    pub postgres_cpu_ms_per_order: BTreeMap<String, f64>,
    /// The system's own CPU per order: the four services, Kafka and
    /// PostgreSQL's share for the system's databases — without the driver,
    /// the gateway stand-in and its database.
    pub own_cpu_ms_per_order: f64,
    /// Rows the services' retention purges deleted over the window, per
    /// service (`purged_rows_total`): the purges ran inside the trial.
    pub purged_rows: BTreeMap<String, f64>,
    /// Seconds to drain after the window (`None`: did not drain within the limit).
    pub drain_secs: Option<f64>,
    /// PostgreSQL per order over the window and its drain.
    pub postgres_per_order: PgPerOrder,
    /// Where PostgreSQL's time went over the window and its drain (empty
    /// unless the server preloads `pg_stat_statements`).
    pub pg_statements: Vec<super::pg_profile::Statement>,
}

/// Runs one trial of `load` at `rate` for `window`.
pub async fn trial(stack: &Stack, load: &Load, rate: f64, window: Duration) -> anyhow::Result<Trial> {
    let orders_db = &stack.db_url("orders");
    let pg_before = PgCounters::read(stack).await?;
    let profiling = super::pg_profile::reset(orders_db).await;
    let purged_before = purged(stack).await;
    let pg_cpu = super::pg_cpu::Sampler::start(stack);
    let before = testkit::process::cpu_seconds_by_command();
    let sampler = super::queues::Sampler::start(stack);
    let sent = load::open_loop(load, orders_db, rate, window).await?;
    let after = testkit::process::cpu_seconds_by_command();
    let owners = pg_cpu.owners().clone();
    let postgres_cpu = pg_cpu.finish(sent.intended.len()).await;
    let purged_rows = purged(stack)
        .await
        .into_iter()
        .map(|(service, n)| (service.clone(), n - purged_before.get(&service).unwrap_or(&0.0)))
        .collect();
    let b = &sent.backlog;
    let backlog_end = *b.last().unwrap_or(&0);
    let backlog_mid = b.get(b.len() / 2).copied().unwrap_or(0);
    let quarter = |q: usize| {
        let part = &b[(b.len() * q / 4).min(b.len())..(b.len() * (q + 1) / 4).min(b.len())];
        part.iter().sum::<i64>() as f64 / part.len().max(1) as f64
    };
    let backlog_growth = quarter(3) - quarter(1);
    let drain = load::wait_drained(orders_db, Duration::from_secs(180)).await?;
    let queues = sampler.finish(stack, window.as_secs() as usize).await;
    let queues_behind: Vec<String> = queues.behind(rate).into_iter().map(str::to_owned).collect();
    let pg_after = PgCounters::read(stack).await?;
    let placed = sent.intended.len();
    let pg_statements = if profiling {
        super::pg_profile::top(orders_db, placed, 15).await?
    } else {
        Vec::new()
    };
    let (lat, _) = load::latencies(orders_db, &sent).await?;
    let secs = sent.elapsed.as_secs_f64().max(window.as_secs_f64());
    let kept_up = backlog_growth <= (0.5 * rate).max(20.0) && drain.is_some();
    let completed_enough = sent.terminal_at_end as f64 >= MIN_COMPLETED * placed as f64;
    Ok(Trial {
        rate,
        placed,
        failed: sent.failed,
        arrivals_per_sec: placed as f64 / secs,
        completed_per_sec: sent.terminal_at_end as f64 / secs,
        backlog_mid,
        backlog_end,
        backlog_growth,
        sustained: sent.on_time() && sent.failed == 0 && kept_up && completed_enough && queues_behind.is_empty(),
        queues,
        queues_behind,
        offered_per_sec: sent.offered_per_sec,
        send_lag_secs: sent.send_lag.as_secs_f64(),
        latency: Percentiles::of(&lat),
        cancels: sent.cancelled.len(),
        cancels_failed: sent.cancels_failed,
        backlog: sent.backlog.clone(),
        own_cpu_ms_per_order: own_cpu(&cpu_per_order(&before, &after, placed), &owners, &postgres_cpu),
        cpu_ms_per_order: cpu_per_order(&before, &after, placed),
        postgres_cpu_ms_per_order: postgres_cpu,
        purged_rows,
        drain_secs: drain.map(|d| d.as_secs_f64()),
        postgres_per_order: pg_before.per_order(pg_after, placed),
        pg_statements,
    })
}

/// `purged_rows_total` of each service with a retention purge, now.
async fn purged(stack: &Stack) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in [Service::OrderApi, Service::Inventory, Service::Payment, Service::Relay] {
        let n = Stack::metric(&stack.admin_url(s), "purged_rows_total", &[]).await;
        out.insert(s.name().to_owned(), n.unwrap_or(0.0));
    }
    out
}

/// The processes whose CPU is not the system's own: the driver and the
/// gateway stand-in (PostgreSQL is split by database instead).
pub const NOT_THE_SYSTEM: [&str; 2] = ["driver (xtask)", "mock-gateway"];

/// The system's own CPU per order: every process but [`NOT_THE_SYSTEM`]
/// and PostgreSQL, plus PostgreSQL's share for the system's databases.
pub fn own_cpu(
    by_process: &BTreeMap<String, f64>,
    owners: &super::pg_cpu::Owners,
    postgres: &BTreeMap<String, f64>,
) -> f64 {
    let services: f64 = by_process
        .iter()
        .filter(|(p, _)| !NOT_THE_SYSTEM.contains(&p.as_str()) && p.as_str() != "postgres")
        .map(|(_, ms)| ms)
        .sum();
    services + super::pg_cpu::Sampler::system_ms(owners, postgres)
}

/// The verdict of every rate tried, from its trials.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Arrival rate.
    pub rate: f64,
    /// Trials at this rate.
    pub trials: usize,
    /// Of them sustained.
    pub sustained: usize,
    /// The majority's verdict (a tie is not sustained).
    pub holds: bool,
    /// Median, minimum and maximum of completions per second.
    pub completed_per_sec: Spread,
    /// … of offered orders per second.
    pub offered_per_sec: Spread,
    /// … of the p99 placed → terminal, ms.
    pub p99_ms: Spread,
    /// … of total CPU per order, ms.
    pub cpu_ms_per_order: Spread,
    /// … of the system's own CPU per order, ms.
    pub own_cpu_ms_per_order: Spread,
}

/// A median and the range around it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Lowest.
    pub min: f64,
    /// Highest.
    pub max: f64,
}

impl Spread {
    /// Of `values` (any order; all zero when empty).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self {
            median: super::pct(&values, 0.5),
            min: values.first().copied().unwrap_or(0.0),
            max: values.last().copied().unwrap_or(0.0),
        }
    }
}

/// Each rate's [`Verdict`], lowest rate first.
pub fn verdicts(trials: &[Trial]) -> Vec<Verdict> {
    let mut by_rate: BTreeMap<u64, Vec<&Trial>> = BTreeMap::new();
    for t in trials {
        by_rate.entry(t.rate.to_bits()).or_default().push(t);
    }
    let mut out: Vec<Verdict> = by_rate
        .into_values()
        .map(|ts| {
            let sustained = ts.iter().filter(|t| t.sustained).count();
            let spread = |f: &dyn Fn(&Trial) -> f64| Spread::of(ts.iter().map(|t| f(t)).collect());
            Verdict {
                rate: ts[0].rate,
                trials: ts.len(),
                sustained,
                holds: 2 * sustained > ts.len(),
                completed_per_sec: spread(&|t| t.completed_per_sec),
                offered_per_sec: spread(&|t| t.offered_per_sec),
                p99_ms: spread(&|t| t.latency.p99_ms),
                cpu_ms_per_order: spread(&|t| t.cpu_ms_per_order.values().sum()),
                own_cpu_ms_per_order: spread(&|t| t.own_cpu_ms_per_order),
            }
        })
        .collect();
    out.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    out
}

/// The bracket the verdicts give: the highest rate that holds below the
/// lowest that does not (0 when none holds), and that lowest failing rate
/// (infinite when every rate held).
pub fn bracket(verdicts: &[Verdict]) -> (f64, f64) {
    let failed = verdicts
        .iter()
        .filter(|v| !v.holds)
        .map(|v| v.rate)
        .fold(f64::INFINITY, f64::min);
    let best = verdicts
        .iter()
        .filter(|v| v.holds && v.rate < failed)
        .map(|v| v.rate)
        .fold(0.0, f64::max);
    (best, failed)
}

/// The next rate to try, or `None` when the bracket is resolved and both
/// of its ends have [`REPEATS`] trials.
pub fn next_rate(verdicts: &[Verdict], start: f64) -> Option<f64> {
    let (best, failed) = bracket(verdicts);
    let trials_at = |rate: f64| verdicts.iter().find(|v| v.rate == rate).map_or(0, |v| v.trials);
    if verdicts.is_empty() {
        Some(start)
    } else if failed.is_infinite() {
        Some(round(best * 1.5))
    } else if best == 0.0 {
        (failed > 1.0).then(|| round(failed * 0.5))
    } else if (failed - best) / best > RESOLUTION {
        Some(round((best + failed) / 2.0))
    } else if trials_at(best) < REPEATS {
        Some(best)
    } else if trials_at(failed) < REPEATS {
        Some(failed)
    } else {
        None
    }
}

/// Rates are whole orders per second.
fn round(rate: f64) -> f64 {
    rate.round().max(1.0)
}

/// Runs trials as [`next_rate`] says, at most `max_trials`; every trial and
/// the sustained rate found (the bracket's lower end).
pub async fn search(
    stack: &Stack,
    load: &Load,
    start: f64,
    window: Duration,
    max_trials: usize,
) -> anyhow::Result<(Vec<Trial>, f64)> {
    let mut trials: Vec<Trial> = Vec::new();
    while trials.len() < max_trials {
        let Some(rate) = next_rate(&verdicts(&trials), start) else {
            break;
        };
        eprintln!("bench: trial {} at {rate:.0} orders/s for {window:?}", trials.len() + 1);
        let t = trial(stack, load, rate, window).await?;
        eprintln!(
            "bench:   placed {} (offered {:.0}/s, latest send {:.1} s late) completed {:.0}/s failed {} backlog mid {} end {} growth {:.0} p99 {:.0} ms → {}",
            t.placed,
            t.offered_per_sec,
            t.send_lag_secs,
            t.completed_per_sec,
            t.failed,
            t.backlog_mid,
            t.backlog_end,
            t.backlog_growth,
            t.latency.p99_ms,
            if t.sustained { "sustained" } else { "not sustained" }
        );
        let drained = t.drain_secs.is_some();
        trials.push(t);
        if !drained {
            eprintln!("bench: the backlog did not drain; stopping the search");
            break;
        }
    }
    let (best, _) = bracket(&verdicts(&trials));
    Ok((trials, best))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(rate: f64, trials: usize, sustained: usize) -> Verdict {
        Verdict {
            rate,
            trials,
            sustained,
            holds: 2 * sustained > trials,
            completed_per_sec: Spread::default(),
            offered_per_sec: Spread::default(),
            p99_ms: Spread::default(),
            cpu_ms_per_order: Spread::default(),
            own_cpu_ms_per_order: Spread::default(),
        }
    }

    /// Plays the search against a machine whose capacity is `capacity`,
    /// where rates within 2 % of it hold one time in two (noise); the
    /// rates tried, in order.
    fn play(capacity: f64, start: f64) -> (Vec<f64>, f64, f64) {
        let mut tried: Vec<(f64, bool)> = Vec::new();
        let mut noisy = false;
        loop {
            let vs = {
                let mut by: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
                for (r, ok) in &tried {
                    let e = by.entry(r.to_bits()).or_default();
                    e.0 += 1;
                    e.1 += usize::from(*ok);
                }
                by.into_iter()
                    .map(|(r, (n, k))| verdict(f64::from_bits(r), n, k))
                    .collect::<Vec<_>>()
            };
            let Some(rate) = next_rate(&vs, start) else {
                let (best, failed) = bracket(&vs);
                return (tried.iter().map(|t| t.0).collect(), best, failed);
            };
            assert!(tried.len() < 40, "the search does not end: {tried:?}");
            let ok = if (rate - capacity).abs() / capacity < 0.02 {
                noisy = !noisy;
                noisy
            } else {
                rate < capacity
            };
            tried.push((rate, ok));
        }
    }

    #[test]
    fn the_search_brackets_the_capacity_within_the_resolution_and_repeats_both_ends() {
        for capacity in [37.0, 180.0, 506.0, 620.0, 759.0, 1_234.0] {
            let (tried, best, failed) = play(capacity, 100.0);
            assert!(best > 0.0 && failed.is_finite(), "{capacity}: {tried:?}");
            assert!((failed - best) / best <= RESOLUTION, "{capacity}: {best} … {failed}");
            assert!(
                best <= capacity * 1.02 && failed >= capacity * 0.98,
                "{capacity}: {best} … {failed}"
            );
            for end in [best, failed] {
                assert!(
                    tried.iter().filter(|r| **r == end).count() >= REPEATS,
                    "{capacity}: {end} in {tried:?}"
                );
            }
            assert!(tried.len() <= 20, "{capacity}: {} trials", tried.len());
        }
    }

    #[test]
    fn a_rate_holds_by_majority_and_a_pass_above_a_failure_does_not_count() {
        let vs = vec![verdict(100.0, 3, 2), verdict(150.0, 3, 1), verdict(225.0, 1, 1)];
        assert_eq!(bracket(&vs), (100.0, 150.0));
        assert_eq!(Spread::of(vec![3.0, 1.0, 2.0]).median, 2.0);
        assert_eq!(next_rate(&[verdict(100.0, 1, 0)], 100.0), Some(50.0));
        assert_eq!(next_rate(&[verdict(100.0, 1, 1)], 100.0), Some(150.0));
    }
}
