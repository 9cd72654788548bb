//! Crash-point faults: which windows each arms, and arming them in real
//! processes that abort there.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::Fault;
use crate::stack::{Service, Stack};

/// The processes and crash points a crash-point fault arms (`None` for
/// the other kinds). A consumer window is armed in every consumer at once:
/// each of them crashes in that window in every round, whichever layer a
/// run has switched off — one schedule for the ordinary run and for every
/// negative control.
pub(super) fn crash_points_of(fault: Fault) -> Option<Vec<(Service, &'static str)>> {
    const CONSUMERS: [Service; 3] = [Service::Inventory, Service::Payment, Service::OrderApi];
    Some(match fault {
        Fault::OrderApiAfterCommit => vec![(
            Service::OrderApi,
            order_api::http::orders::CRASH_AFTER_COMMIT_BEFORE_RESPONSE,
        )],
        Fault::OrderApiBeforeCommit => vec![(Service::OrderApi, order_api::http::orders::CRASH_BEFORE_COMMIT)],
        Fault::RelayAfterPublish => vec![(Service::Relay, outbox::relay::CRASH_AFTER_PUBLISH_BEFORE_MARK)],
        Fault::PaymentAfterCharge => vec![(
            Service::Payment,
            payment_service::payments::CRASH_AFTER_GATEWAY_BEFORE_RECORD,
        )],
        Fault::ConsumerBeforeOffsetCommit => CONSUMERS
            .iter()
            .map(|s| (*s, kafka::consumer::CRASH_BEFORE_OFFSET_COMMIT))
            .collect(),
        Fault::ConsumerInTransaction => CONSUMERS
            .iter()
            .map(|s| (*s, saga_kit::consumer::CRASH_IN_TRANSACTION))
            .collect(),
        _ => return None,
    })
}

/// Restarts each of `targets`' services armed with its crash point, which
/// aborts the process the next time it is reached; restarts each unarmed as
/// soon as it aborted (the others' fresh work may depend on it), or after
/// 20 s without reaching its point. Fired when at least one aborted there;
/// the detail says which.
pub(super) async fn crash_at(
    stack: &mut Stack,
    targets: &[(Service, &str)],
    crash_points: &mut BTreeMap<String, u32>,
) -> anyhow::Result<(String, bool)> {
    let mut before = Vec::with_capacity(targets.len());
    for &(s, point) in targets {
        before.push(stack.crash_point_reports(s, point));
        stack.arm(s, point);
        stack.restart_unready(s).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut outcome: Vec<Option<bool>> = vec![None; targets.len()];
    while outcome.iter().any(Option::is_none) {
        let late = Instant::now() >= deadline;
        for (k, &(s, point)) in targets.iter().enumerate() {
            if outcome[k].is_some() {
                continue;
            }
            let exited = !stack.is_running(s);
            if !exited && !late {
                continue;
            }
            stack.disarm(s);
            // Fired only on the process's own word, and only if it died by
            // the abort that follows (SIGABRT), not by any other exit.
            let aborted = {
                use std::os::unix::process::ExitStatusExt as _;
                exited && stack.last_exit(s).and_then(|e| e.signal()) == Some(6)
            };
            let fired = aborted && stack.crash_point_reports(s, point) > before[k];
            if fired {
                *crash_points.entry(format!("{}: {point}", s.name())).or_default() += 1;
            }
            if exited {
                stack.start_service(s).await?;
            } else {
                stack.restart(s).await?;
            }
            outcome[k] = Some(fired);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let words: Vec<String> = targets
        .iter()
        .zip(&outcome)
        .map(|((s, _), fired)| {
            format!(
                "{}{}",
                s.name(),
                if *fired == Some(true) {
                    ""
                } else {
                    " (no fresh work reached it)"
                }
            )
        })
        .collect();
    let any = outcome.contains(&Some(true));
    Ok((format!("{} at {}", words.join(", "), targets[0].1), any))
}

/// Every (service, crash point) pair the crash-point faults arm.
pub fn crash_point_pairs() -> Vec<String> {
    Fault::FIRST_ROUND
        .into_iter()
        .filter_map(crash_points_of)
        .flatten()
        .map(|(s, point)| format!("{}: {point}", s.name()))
        .collect()
}

/// Whether every pair `fault` arms has fired at least once so far.
pub(super) fn every_pair_fired(fault: Fault, crash_points: &BTreeMap<String, u32>) -> bool {
    crash_points_of(fault).is_some_and(|targets| {
        targets
            .iter()
            .all(|(s, point)| crash_points.contains_key(&format!("{}: {point}", s.name())))
    })
}
