//! The log's verdict beside the databases': what the broker's log read
//! back says of each event — answered twice, applied from a later copy,
//! lost before the log, handled without its effect — written into the
//! audit as counts, evidence and violations.

use super::{before_log, effects, provenance};
use crate::stack::Stack;

/// The checks that read the broker's log beside the databases: events
/// answered twice, copies applied late, losses before the log, events
/// against their effects. Returns what could not be read.
pub(super) async fn log_checks(
    stack: &Stack,
    log: &provenance::Log,
    audit: &mut crate::invariants::Audit,
) -> Vec<String> {
    let mut problems = Vec::new();
    applied_twice_in_the_log(audit, &log.answered_twice());
    match provenance::late_copies(stack, log).await {
        Ok(late) => rescued_by_late_copies(audit, &late),
        Err(e) => problems.push(format!("could not tell which copies the inboxes applied: {e}")),
    }
    match before_log::lost_before_the_log(stack, log).await {
        Ok(lost) => lost_before_the_log(audit, &lost),
        Err(e) => problems.push(format!("could not hold the outboxes against the log: {e}")),
    }
    match effects::ground(stack).await {
        Ok(ground) => events_against_effects(audit, &effects::check(log, &ground)),
        Err(e) => problems.push(format!("could not hold the events against their effects: {e}")),
    }
    problems
}

/// Events applied from a later copy than the first are rescues: counted
/// per cause, and a loss in a run that loses nothing on purpose.
fn rescued_by_late_copies(audit: &mut crate::invariants::Audit, late: &[provenance::LateCopy]) {
    audit.applied_from_later_copy = late.len();
    if late.is_empty() {
        return;
    }
    for l in late {
        // Re-sent and applied from the re-sent copy: a rescue, not lateness.
        for late_orders in audit.late_not_lost.values_mut() {
            late_orders.remove(&l.order_id);
        }
        let cause = if l.injected {
            "applied from an injected copy (the first copy lost)"
        } else {
            "applied from a copy published again (the first copy lost)"
        };
        audit.rescued.entry(cause.into()).or_default().insert(l.order_id);
        if audit.rescue_evidence.len() < 20 {
            audit.rescue_evidence.push(format!(
                "order {}: {} applied event {} from offset {}, its first copy at {}{}",
                l.order_id,
                l.consumer,
                l.event_id,
                l.applied,
                l.first,
                if l.injected { " (the copy was injected)" } else { "" }
            ));
        }
    }
    audit.late_not_lost.retain(|_, orders| !orders.is_empty());
    let injected = late.iter().filter(|l| l.injected).count();
    audit.seen(crate::invariants::NOTHING_LOST, late.iter().map(|l| l.at).min());
    audit.violations.push(format!(
        "{}: {} events were applied from a later copy than the first their consumer was delivered \
         ({injected} from an injected copy, {} from one published again): the first copy's effect was lost",
        crate::invariants::NOTHING_LOST,
        late.len(),
        late.len() - injected
    ));
}

/// Messages lost before the log break "nothing lost", whatever finished
/// their orders later: the orders leave "late, not lost" for the rescues.
fn lost_before_the_log(audit: &mut crate::invariants::Audit, lost: &[before_log::Lost]) {
    audit.lost_before_the_log = lost.len();
    audit.lost_before_the_log_evidence = lost.iter().take(20).map(|l| l.what.clone()).collect();
    if lost.is_empty() {
        return;
    }
    let orders = before_log::per_order(lost);
    for late_orders in audit.late_not_lost.values_mut() {
        late_orders.retain(|o| !orders.contains_key(o));
    }
    audit.late_not_lost.retain(|_, o| !o.is_empty());
    audit
        .rescued
        .entry("lost before the log".into())
        .or_default()
        .extend(orders.keys().copied());
    audit.seen(crate::invariants::NOTHING_LOST, lost.iter().map(|l| l.at).min());
    audit.violations.push(format!(
        "{}: {} messages of {} orders were lost before the log (marked published with no copy appended \
         before the mark, or re-sent when they existed nowhere), e.g. {}",
        crate::invariants::NOTHING_LOST,
        lost.len(),
        orders.len(),
        lost[0].what
    ));
}

/// Each event against its inbox row and its effect: an event never
/// handled, or handled without its effect, is lost; an effect without its
/// inbox row was applied by a consumer that deduplicates nothing; an inbox
/// row without its source hides which copy was applied.
fn events_against_effects(audit: &mut crate::invariants::Audit, f: &effects::Findings) {
    use crate::invariants::{NOTHING_LOST, STEP_ONCE};
    audit.never_handled = f.never_handled.len();
    audit.handled_without_effect = f.handled_without_effect.len();
    audit.effect_without_inbox = f.effect_without_inbox.len();
    audit.inbox_without_source = f.inbox_without_source.len();
    for (invariant, found, words) in [
        (
            NOTHING_LOST,
            &f.never_handled,
            "events in the log their consumer's inbox does not hold (its group committed past them: \
             acknowledged, never handled)",
        ),
        (
            NOTHING_LOST,
            &f.handled_without_effect,
            "events recorded in an inbox whose effect is absent (marked handled, effect lost)",
        ),
        (
            STEP_ONCE,
            &f.effect_without_inbox,
            "effects applied with no inbox row for their event (nothing stops a repeat)",
        ),
        (
            NOTHING_LOST,
            &f.inbox_without_source,
            "inbox rows naming no copy in the log (which copy was applied cannot be told)",
        ),
    ] {
        if let Some(first) = found.first() {
            audit.effects_evidence.extend(found.iter().take(5).cloned());
            audit
                .violations
                .push(format!("{invariant}: {} {words}, e.g. {first}", found.len()));
        }
    }
}

/// Events the log shows answered twice break "each step applied once".
fn applied_twice_in_the_log(audit: &mut crate::invariants::Audit, twice: &[provenance::AnsweredTwice]) {
    audit.events_answered_twice = twice.len();
    let Some(first) = twice.first() else {
        return;
    };
    audit.seen(crate::invariants::STEP_ONCE, twice.iter().filter_map(|t| t.at).min());
    audit.violations.push(format!(
        "{}: {} events caused two or more distinct events of one type in the log (applied twice), \
         e.g. event {} of order {} answered {} times with {}",
        crate::invariants::STEP_ONCE,
        twice.len(),
        first.cause,
        first.order_id,
        first.answers,
        first.event_type
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An order re-sent to past its deadline is late, not lost, while its
    /// first copy is the one applied; the log showing the re-sent copy
    /// applied makes it a rescue — and the run's failure.
    #[test]
    fn a_resent_order_is_late_unless_the_log_shows_its_resent_copy_applied() {
        let (late, rescued) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let mut audit = crate::invariants::Audit::default();
        audit
            .late_not_lost
            .insert("Resent:ReserveStock".into(), [late, rescued].into_iter().collect());
        rescued_by_late_copies(&mut audit, &[]);
        assert!(audit.violations.is_empty() && audit.rescued.is_empty());
        let copy = provenance::LateCopy {
            consumer: "inventory-service",
            event_id: uuid::Uuid::new_v4(),
            order_id: rescued,
            injected: false,
            first: 3,
            applied: 9,
            at: chrono::Utc::now(),
        };
        rescued_by_late_copies(&mut audit, &[copy]);
        assert_eq!(audit.late_not_lost["Resent:ReserveStock"], [late].into_iter().collect());
        assert!(audit.rescued.values().any(|o| o.contains(&rescued)));
        assert_eq!(audit.violations.len(), 1, "{:?}", audit.violations);
    }
}
