//! The connections the relay keeps between uses (machinery, measured:
//! docs/results/code-decisions.md).

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

/// The relay's connections between two uses, kept out of the pool.
///
/// sqlx tests every connection it takes back into the pool with a round
/// trip (a `Sync` and its reply, in a task it spawns) — not a statement,
/// so `pg_stat_statements` never shows it. A relay uses a connection for
/// each claim, each batch's bookkeeping and each idle probe, hundreds of
/// times a second: kept here, a connection goes back to work without that
/// round trip. Only a connection whose last use succeeded (committed,
/// rolled back, or outside any transaction) is kept; any other is dropped
/// into the pool's own handling. One that died while kept fails its next
/// statement, which the relay retries like any failed claim.
pub(super) struct Spare {
    pool: PgPool,
    kept: std::sync::Mutex<Vec<PoolConnection<Postgres>>>,
    /// At most this many are kept; more go back to the pool.
    keep: usize,
}

impl Spare {
    /// Keeps at most `keep` connections of `pool`.
    pub(super) fn new(pool: PgPool, keep: usize) -> Self {
        Self {
            pool,
            kept: std::sync::Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A kept connection, or one from the pool.
    pub(super) async fn take(&self) -> sqlx::Result<PoolConnection<Postgres>> {
        let kept = self.kept.lock().expect("spare connections").pop();
        match kept {
            Some(conn) => Ok(conn),
            None => self.pool.acquire().await,
        }
    }

    /// Keeps `conn`, whose last use succeeded and left no transaction open
    /// — unless every connection of the pool is out and none idle: then a
    /// task sharing the pool may be waiting for one, and `conn` goes back.
    pub(super) fn keep(&self, conn: PoolConnection<Postgres>) {
        let full = self.pool.size() >= self.pool.options().get_max_connections() && self.pool.num_idle() == 0;
        let mut kept = self.kept.lock().expect("spare connections");
        if kept.len() < self.keep && !full {
            kept.push(conn);
        }
    }

    /// Gives every kept connection back to the pool. The relay does so
    /// whenever it returns from [`super::Relay::run`] or [`super::Relay::run_once`]: a
    /// connection kept past that would hold up `PgPool::close` for as long
    /// as the relay lives.
    pub(super) fn release(&self) {
        let kept = std::mem::take(&mut *self.kept.lock().expect("spare connections"));
        drop(kept);
    }
}
