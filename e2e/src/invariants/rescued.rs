//! The deadline reconciler's rescues, read from the orders' history: a
//! message that did not arrive in time, lost or late — and which of them the
//! run may have.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::PgConnection;
use uuid::Uuid;

use super::{Audit, Expected, NOTHING_LOST};

/// The orders the deadline reconciler acted on, read from their history.
#[derive(Debug, Clone, Default)]
pub struct Rescued {
    /// Orders per action (the history's cause).
    pub per_cause: BTreeMap<String, BTreeSet<Uuid>>,
    /// The history rows that say so (the first 20), as evidence.
    pub evidence: Vec<String>,
    /// When the reconciler first acted.
    pub first: Option<chrono::DateTime<chrono::Utc>>,
}

/// A history row: order, cause, from, to, when.
type HistoryRow = (Uuid, String, Option<String>, String, chrono::DateTime<chrono::Utc>);

/// Reads [`Rescued`] from the orders database's history.
pub async fn rescued(db: &mut PgConnection) -> anyhow::Result<Rescued> {
    let rows: Vec<HistoryRow> = sqlx::query_as(
        "SELECT order_id, cause, from_status, to_status, at FROM order_history
         WHERE cause LIKE 'Resent:%' OR cause LIKE 'Reconciled:%' OR cause = 'DeadlineExceeded'
         ORDER BY id",
    )
    .fetch_all(&mut *db)
    .await?;
    let mut r = Rescued::default();
    for (order, cause, from, to, at) in &rows {
        r.per_cause.entry(cause.clone()).or_default().insert(*order);
        r.first = Some(r.first.map_or(*at, |first| first.min(*at)));
        if r.evidence.len() < 20 {
            r.evidence.push(format!(
                "{} order {order}: {} → {to} by {cause}",
                at.format("%H:%M:%S%.3f"),
                from.as_deref().unwrap_or("-")
            ));
        }
    }
    Ok(r)
}

/// Nothing rescued in silence: a re-send or a reconciliation means a
/// message did not arrive before its deadline — lost (acknowledged before
/// it was handled, recorded without its effect) or stuck. The reconciler
/// hides that from the order's status, so the audit counts it and accepts
/// exactly the orders the run lost on purpose.
pub(super) async fn check_rescued(
    db: &mut PgConnection,
    payments_db: &mut PgConnection,
    expected: &Expected,
    a: &mut Audit,
) -> anyhow::Result<()> {
    let Rescued {
        per_cause,
        evidence,
        mut first,
    } = rescued(db).await?;
    (a.rescued, a.rescue_evidence) = (per_cause, evidence);
    // payment-service's own reconciler settles an operation left PENDING
    // past its deadline from the gateway's record: a command or a result
    // that did not arrive in time, as much a rescue as order-api's.
    let settled: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT order_id, kind, reconciled_at FROM payments WHERE reconciled_at IS NOT NULL ORDER BY reconciled_at",
    )
    .fetch_all(payments_db)
    .await?;
    for (order, kind, at) in settled {
        a.rescued
            .entry("payment-service reconciled".into())
            .or_default()
            .insert(order);
        first = Some(first.map_or(at, |f| f.min(at)));
        if a.rescue_evidence.len() < 20 {
            a.rescue_evidence.push(format!(
                "{} order {order}: {kind} settled by payment-service's reconciler",
                at.format("%H:%M:%S%.3f")
            ));
        }
    }
    if expected.resends_judged_by_the_log {
        // Orders only re-sent to, or reconciled before the reply they stood
        // in for arrived: the log decides (late copies), not the deadline.
        let overtaken = overtaken_by_the_reconciler(db).await?;
        let late_kind =
            |cause: &str, order: &Uuid| cause.starts_with("Resent:") || overtaken.contains(&(cause.to_owned(), *order));
        let other: BTreeSet<Uuid> = a
            .rescued
            .iter()
            .flat_map(|(cause, orders)| orders.iter().filter(|o| !late_kind(cause, o)).copied())
            .collect();
        for (cause, orders) in std::mem::take(&mut a.rescued) {
            let (late, rescued): (BTreeSet<Uuid>, BTreeSet<Uuid>) = orders
                .into_iter()
                .partition(|o| late_kind(&cause, o) && !other.contains(o));
            for (map, orders) in [(&mut a.late_not_lost, late), (&mut a.rescued, rescued)] {
                map.extend((!orders.is_empty()).then(|| (cause.clone(), orders)));
            }
        }
        first = first.filter(|_| !a.rescued.is_empty());
    }
    let touched: BTreeSet<Uuid> = a.rescued.values().flatten().copied().collect();
    let unexpected: Vec<&Uuid> = touched.difference(&expected.rescue_expected).collect();
    if !unexpected.is_empty() {
        a.seen(NOTHING_LOST, first);
        let per_cause: BTreeMap<&str, usize> = a.rescued.iter().map(|(c, o)| (c.as_str(), o.len())).collect();
        a.violations.push(format!(
            "{NOTHING_LOST}: {} orders reached the deadline reconciler in a run that loses no message on purpose \
             (orders per action: {per_cause:?}; first: {}) — a message was lost and rescued in silence",
            unexpected.len(),
            a.rescue_evidence.first().map_or("", String::as_str)
        ));
    }
    let missed: Vec<&Uuid> = expected.rescue_expected.difference(&touched).collect();
    if !missed.is_empty() {
        a.violations.push(format!(
            "{NOTHING_LOST}: {} orders lost on purpose never reached the reconciler (first: {})",
            missed.len(),
            missed[0]
        ));
    }
    Ok(())
}

/// The reconciler's actions (`Reconciled:<reply>`, by order) that the reply
/// they stood in for overtook only in time: the order's history holds that
/// reply, by its event id, handled after the reconciler's row and found
/// already applied (`applied = false`). Such a reply arrived late (a
/// partition, a backlog), not lost — while one that never arrives, or whose
/// effect was lost with its inbox row kept, leaves no such row. The log
/// then checks it was the reply's first copy ([`Audit::late_not_lost`]).
async fn overtaken_by_the_reconciler(db: &mut PgConnection) -> anyhow::Result<BTreeSet<(String, Uuid)>> {
    Ok(sqlx::query_as::<_, (String, Uuid)>(
        "SELECT DISTINCT r.cause, r.order_id FROM order_history r
         JOIN order_history l ON l.order_id = r.order_id AND l.id > r.id
          AND 'Reconciled:' || l.cause = r.cause AND l.event_id IS NOT NULL AND NOT l.applied
         WHERE r.cause LIKE 'Reconciled:%'",
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .collect())
}

#[cfg(test)]
mod tests {
    use sqlx::Connection as _;
    use uuid::Uuid;

    use super::overtaken_by_the_reconciler;

    /// Only a reply handled after the reconciler's row, of the type it stood
    /// in for and found already applied, makes a reconciliation "overtaken".
    #[tokio::test]
    async fn only_a_reply_handled_after_the_reconciliation_overtook_it() {
        let (db, _pool) = testkit::db::TempDb::with_tables(
            "eo_overtaken",
            vec![],
            "CREATE TABLE order_history (id bigserial PRIMARY KEY, order_id uuid NOT NULL, from_status text,
             to_status text NOT NULL, cause text NOT NULL, event_id uuid, applied boolean NOT NULL)",
        )
        .await
        .unwrap();
        let mut c = sqlx::PgConnection::connect(db.url()).await.unwrap();
        let [late, lost, before, other_type, reapplied] = [(); 5].map(|()| Uuid::new_v4());
        let row = |order: Uuid, cause: &'static str, event: bool, applied: bool| {
            (order, cause, event.then(Uuid::new_v4), applied)
        };
        for (order, cause, event_id, applied) in [
            row(before, "PaymentCaptured", true, false),
            row(late, "Reconciled:PaymentCaptured", false, true),
            row(lost, "Reconciled:PaymentCaptured", false, true),
            row(before, "Reconciled:PaymentCaptured", false, true),
            row(other_type, "Reconciled:PaymentCaptured", false, true),
            row(reapplied, "Reconciled:PaymentCaptured", false, true),
            row(late, "PaymentCaptured", true, false),
            row(other_type, "PaymentDeclined", true, false),
            row(reapplied, "PaymentCaptured", true, true),
        ] {
            sqlx::query(
                "INSERT INTO order_history (order_id, to_status, cause, event_id, applied)
                 VALUES ($1, 'CONFIRMED', $2, $3, $4)",
            )
            .bind(order)
            .bind(cause)
            .bind(event_id)
            .bind(applied)
            .execute(&mut c)
            .await
            .unwrap();
        }
        let overtaken = overtaken_by_the_reconciler(&mut c).await.unwrap();
        assert_eq!(
            overtaken,
            [("Reconciled:PaymentCaptured".to_owned(), late)].into_iter().collect()
        );
        c.close().await.unwrap();
    }
}
