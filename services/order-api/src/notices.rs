//! Order-confirmation notices: a side effect whose provider offers no
//! idempotency key (the mock notifier, `POST /v1/notices`).
//!
//! The saga writes an intent row (`notices`, PENDING) in the transaction
//! that confirms the order, so a confirmed order always has one. This
//! worker claims pending rows, sends each notice and marks the row SENT.
//! Without a key, and without a way to ask the provider what it received, a
//! crash between the send and the mark leaves nothing that tells whether the
//! customer got the notice. So the worker must choose, and says which
//! (`NOTICE_DELIVERY`):
//!
//! - **at-least-once** (the default): send, then mark. A crash between them
//!   sends the notices of that round again: a second notice, at most one
//!   more per notice and crash, counted (`notices_sent_total`) and visible
//!   to the customer.
//! - **at-most-once**: mark, then send. A crash between them loses the
//!   notice: the row says SENT and the provider never saw it.
//!
//! There is no third choice from this side alone: effectively-once needs
//! the provider's help — an idempotency key it deduplicates on (as the
//! payment gateway's), or a record it can be asked about (as the gateway's
//! lookup by key) — docs/design.md, "Delivery semantics".

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

/// Crash point (failpoints builds): abort after the notices were sent and
/// before their rows are marked — at-least-once sends them again.
pub const CRASH_AFTER_SEND_BEFORE_MARK: &str = "order_api::notice_after_send_before_mark";
/// Crash point (failpoints builds): abort after the rows were marked SENT
/// and before the notices are sent — at-most-once has lost them.
pub const CRASH_AFTER_MARK_BEFORE_SEND: &str = "order_api::notice_after_mark_before_send";

/// Which side of a crash a notice falls on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Delivery {
    /// Send, then mark: a crash between them sends it twice.
    AtLeastOnce,
    /// Mark, then send: a crash between them loses it.
    AtMostOnce,
}

impl Delivery {
    /// Its name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "at-least-once",
            Delivery::AtMostOnce => "at-most-once",
        }
    }
}

/// The notice worker's settings.
#[derive(Debug, Clone, clap::Args)]
pub struct NoticeArgs {
    /// Send then mark (`at-least-once`: a crash between them sends a notice
    /// twice) or mark then send (`at-most-once`: a crash loses it).
    #[arg(long = "notice-delivery", env = "NOTICE_DELIVERY", value_enum, default_value_t = Delivery::AtLeastOnce)]
    pub delivery: Delivery,
    /// How often the worker looks for pending notices, in milliseconds.
    #[arg(long = "notice-interval-ms", env = "NOTICE_INTERVAL_MS", default_value_t = 500)]
    pub interval_ms: u64,
}

impl NoticeArgs {
    /// The worker's period.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.max(1))
    }
}

/// Notices claimed per round.
const BATCH: i64 = 50;

/// Writes the intent rows of orders just confirmed, in the caller's
/// transaction (the one that confirms them).
pub async fn intend(conn: &mut sqlx::PgConnection, orders: &[Uuid]) -> sqlx::Result<()> {
    if orders.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO notices (order_id, status) SELECT unnest($1::uuid[]), 'PENDING'
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(orders)
    .execute(conn)
    .await?;
    Ok(())
}

/// One round: claims up to a batch of pending notices (`FOR UPDATE SKIP
/// LOCKED`: instances share the work), sends and marks them in the order
/// `delivery` says. Returns how many were sent.
pub async fn send_pending(
    pool: &PgPool,
    gateway: &crate::gateway::Client,
    delivery: Delivery,
) -> anyhow::Result<usize> {
    let mut tx = pool.begin().await?;
    let orders: Vec<Uuid> = sqlx::query_scalar(
        "SELECT order_id FROM notices WHERE status = 'PENDING'
         ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    if orders.is_empty() {
        return Ok(0);
    }
    let labels = [("delivery", delivery.as_str())];
    match delivery {
        Delivery::AtLeastOnce => {
            // A failed send ends the round: those sent before it are marked,
            // the rest stay pending for the next.
            let (mut sent, mut failed) = (Vec::with_capacity(orders.len()), None);
            for order in &orders {
                match gateway.notify(*order).await {
                    Ok(()) => sent.push(*order),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
                telemetry::metrics::incr("notices_sent_total", &labels);
            }
            fail::fail_point!(CRASH_AFTER_SEND_BEFORE_MARK, |_| telemetry::crash_point(
                CRASH_AFTER_SEND_BEFORE_MARK
            ));
            mark_sent(&mut tx, &sent).await?;
            tx.commit().await?;
            if let Some(e) = failed {
                return Err(e.into());
            }
            return Ok(sent.len());
        }
        Delivery::AtMostOnce => {
            mark_sent(&mut tx, &orders).await?;
            tx.commit().await?;
            fail::fail_point!(CRASH_AFTER_MARK_BEFORE_SEND, |_| telemetry::crash_point(
                CRASH_AFTER_MARK_BEFORE_SEND
            ));
            for order in &orders {
                // Marked already: a notice that fails now is lost, by choice.
                match gateway.notify(*order).await {
                    Ok(()) => telemetry::metrics::incr("notices_sent_total", &labels),
                    Err(e) => {
                        tracing::warn!(order_id = %order, error = %e, "notice lost (at-most-once)");
                        telemetry::metrics::incr("notices_lost_total", &labels);
                    }
                }
            }
        }
    }
    Ok(orders.len())
}

async fn mark_sent(conn: &mut sqlx::PgConnection, orders: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query("UPDATE notices SET status = 'SENT', sent_at = now() WHERE order_id = ANY($1)")
        .bind(orders)
        .execute(conn)
        .await?;
    Ok(())
}
