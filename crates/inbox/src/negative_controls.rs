//! NEGATIVE CONTROLS ONLY (feature `negative-controls`; this project's
//! failpoints builds turn it on through its `switches` crate): the two
//! broken inboxes the chaos suite swaps in, to show it notices either.
//! Each is chosen once, at a process's start, and stays chosen; each
//! function of the crate it replaces hands over to it in its first
//! statement. Built without the feature, this module does not exist and
//! the inbox cannot be switched off.
//!
//! - [`turn_off`] — an inbox that remembers nothing (Eventuate's
//!   `NoopDuplicateMessageDetector`): every delivery is new, no row, no
//!   reply kept, nothing seen;
//! - [`commit_apart`] — an inbox whose rows commit in a transaction of
//!   their own, before the effects they stand for.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::{Delivery, Fresh, Recorded};

static OFF: AtomicBool = AtomicBool::new(false);
static APART: AtomicBool = AtomicBool::new(false);

/// From now on the inbox records nothing and reports every delivery as new.
pub fn turn_off() {
    OFF.store(true, Ordering::SeqCst);
}

/// From now on [`crate::begin_batch`] commits the inbox rows in their own
/// transaction, before the effects they stand for, and returns a new one
/// for the effects.
pub fn commit_apart() {
    APART.store(true, Ordering::SeqCst);
}

pub(crate) fn off() -> bool {
    OFF.load(Ordering::Relaxed)
}

pub(crate) fn apart() -> bool {
    APART.load(Ordering::Relaxed)
}

/// [`crate::record`] of the inbox that remembers nothing.
pub(crate) fn record() -> Recorded {
    Recorded::New
}

/// [`crate::record_batch`] of the inbox that remembers nothing.
pub(crate) fn record_batch(deliveries: &[Delivery]) -> Vec<Recorded> {
    vec![Recorded::New; deliveries.len()]
}

/// [`crate::begin_batch`] with the inbox rows committed apart: recorded and
/// committed first, then a new transaction for the effects — a crash
/// between the two leaves events "processed" with no effect.
pub(crate) async fn begin_batch(
    pool: &sqlx::PgPool,
    consumer: &str,
    deliveries: &[Delivery],
) -> sqlx::Result<(sqlx::Transaction<'static, sqlx::Postgres>, Fresh)> {
    let mut rows = pool.begin().await?;
    let recorded = crate::record_batch(&mut rows, consumer, deliveries).await?;
    rows.commit().await?;
    Ok((pool.begin().await?, Fresh(recorded)))
}
