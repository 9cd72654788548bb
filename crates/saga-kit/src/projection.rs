//! A consumer that needs no inbox (seed 000, "when an inbox is not needed"):
//! the order-progress read model.
//!
//! Each reply of the saga (`order.events`) sets a flag on its order's row —
//! stock reserved, payment captured, refunded… — and moves `last_event_at`
//! forward. Setting a flag that is already set changes nothing
//! (idempotent), and flags set in any order end the same (commutative, as
//! is `GREATEST`): so a redelivered copy, a batch handled twice, or a
//! replay of the whole topic leaves the table as it was. The write alone
//! is the deduplication; an inbox row per event would buy nothing and cost
//! a row, an index entry and WAL per message
//! (`cargo bench -p saga-kit --bench inbox_cost` measures how much).
//!
//! What would need an inbox: any write that counts (`n = n + 1`, `stock =
//! stock - quantity`), keeps the first or the last of something by arrival
//! (a redelivery arrives last), or calls out (a charge, a notice). The
//! test beside this module shows the same redelivery double a counter.
//!
//! Not deployed: the stack runs no read model, so the hot path pays for
//! none. A service that wants one runs [`apply`] as its batch handler.

use contract::Envelope;
use sqlx::PgConnection;

/// The read model's table.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS order_progress (
    order_id      uuid        PRIMARY KEY,
    reserved      boolean     NOT NULL DEFAULT false,
    rejected      boolean     NOT NULL DEFAULT false,
    released      boolean     NOT NULL DEFAULT false,
    paid          boolean     NOT NULL DEFAULT false,
    declined      boolean     NOT NULL DEFAULT false,
    refunded      boolean     NOT NULL DEFAULT false,
    last_event_at timestamptz NOT NULL
)";

/// The flags, in the table's order, and the reply type that sets each.
pub const FLAGS: [(&str, &str); 6] = [
    ("reserved", "StockReserved"),
    ("rejected", "StockRejected"),
    ("released", "StockReleased"),
    ("paid", "PaymentCaptured"),
    ("declined", "PaymentDeclined"),
    ("refunded", "PaymentRefunded"),
];

/// Applies a batch of replies in one statement: per order, the flags its
/// replies set, OR-ed into its row, and the latest time. Types it does not
/// show (`RefundFailed`) touch only `last_event_at`.
pub async fn apply(conn: &mut PgConnection, batch: &[Envelope]) -> sqlx::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let sets: Vec<String> = FLAGS
            .iter()
            .map(|(flag, ty)| format!("bool_or(ty = '{ty}') AS {flag}"))
            .collect();
        let names: Vec<&str> = FLAGS.iter().map(|(flag, _)| *flag).collect();
        let merge: Vec<String> = names
            .iter()
            .map(|f| format!("{f} = order_progress.{f} OR EXCLUDED.{f}"))
            .collect();
        // Grouped by order first: one statement may not update a row twice.
        format!(
            "INSERT INTO order_progress (order_id, {cols}, last_event_at)
             SELECT o, {sets}, max(at) FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS t(o, ty, at)
             GROUP BY o
             ON CONFLICT (order_id) DO UPDATE SET {merge},
                 last_event_at = GREATEST(order_progress.last_event_at, EXCLUDED.last_event_at)",
            cols = names.join(", "),
            sets = sets.join(", "),
            merge = merge.join(", "),
        )
    });
    sqlx::query(&SQL)
        .bind(batch.iter().map(|e| e.order_id).collect::<Vec<_>>())
        .bind(batch.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>())
        .bind(batch.iter().map(|e| e.occurred_at).collect::<Vec<_>>())
        .execute(conn)
        .await?;
    Ok(())
}
