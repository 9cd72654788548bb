//! Operations left PENDING: a command dead-lettered after its operation was
//! recorded, or a charge the order's saga already settled from the
//! gateway's record while this service was down. Past the deadline each is
//! asked of the gateway by its key: a record settles it (status and reply,
//! as the command would have); no record leaves it PENDING — no money moved
//! under that key, and the order's own deadline re-sends the command.

use std::time::Duration;

use uuid::Uuid;

use crate::gateway::Reply;
use crate::payments::{outcome, record_all, PaymentKind, Settlement};
use crate::Deps;

/// What one scan did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Overdue PENDING operations found.
    pub overdue: usize,
    /// Settled from the gateway's record.
    pub settled: usize,
    /// Nothing at the gateway under the key (left PENDING, deadline restarted).
    pub absent: usize,
    /// Gateway unavailable: left for the next scan.
    pub skipped: usize,
}

/// Settles, from the gateway's record, up to 100 operations PENDING for longer than `deadline`.
pub async fn tick(deps: &Deps, deadline: Duration) -> anyhow::Result<Report> {
    let (pending, oldest): (i64, f64) = sqlx::query_as(
        "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(updated_at)), 0)::float8
         FROM payments WHERE status = 'PENDING'",
    )
    .fetch_one(&deps.pool)
    .await?;
    telemetry::metrics::set("payments_pending", &[], pending as f64);
    telemetry::metrics::set("payments_oldest_pending_seconds", &[], oldest);
    let overdue: Vec<(Uuid, PaymentKind, String)> = sqlx::query_as(
        "SELECT order_id, kind, idempotency_key FROM payments
         WHERE status = 'PENDING' AND updated_at < now() - make_interval(secs => $1)
         ORDER BY updated_at LIMIT 100",
    )
    .bind(deadline.as_secs_f64())
    .fetch_all(&deps.pool)
    .await?;
    let mut report = Report {
        overdue: overdue.len(),
        ..Report::default()
    };
    for (order_id, kind, key) in overdue {
        let action = match deps
            .gateway
            .lookup(&key, None)
            .await
            .map(|op| op.as_ref().map(Reply::of_operation))
        {
            Err(e) => {
                tracing::warn!(%order_id, error = %e, "gateway lookup failed");
                report.skipped += 1;
                "skipped"
            }
            Ok(None) => {
                sqlx::query(
                    "UPDATE payments SET updated_at = now() WHERE order_id = $1 AND kind = $2 AND status = 'PENDING'",
                )
                .bind(order_id)
                .bind(kind)
                .execute(&deps.pool)
                .await?;
                report.absent += 1;
                "absent"
            }
            Ok(Some(reply)) => {
                let (status, message) = outcome(kind, reply).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                let mut tx = deps.pool.begin().await?;
                let settlement = Settlement {
                    order_id,
                    kind,
                    status,
                    reply: &message,
                    cause: None,
                    span: &tracing::Span::current(),
                };
                if record_all(&mut tx, &[settlement]).await?[0] {
                    sqlx::query("UPDATE payments SET reconciled_at = now() WHERE order_id = $1 AND kind = $2")
                        .bind(order_id)
                        .bind(kind)
                        .execute(&mut *tx)
                        .await?;
                    tracing::info!(%order_id, kind = kind.as_str(), status = status.as_str(), "PENDING operation settled from the gateway's record");
                }
                tx.commit().await?;
                report.settled += 1;
                "settled"
            }
        };
        telemetry::metrics::incr(
            "payment_reconciliations_total",
            &[("kind", kind.as_str()), ("result", action)],
        );
    }
    Ok(report)
}

/// One scan, as the periodic task runs it: the report logged when it found
/// overdue payments.
pub async fn scan(deps: &Deps, deadline: Duration) -> anyhow::Result<()> {
    let r = tick(deps, deadline).await?;
    if r.overdue > 0 {
        tracing::info!(?r, "PENDING payments scan");
    }
    Ok(())
}
