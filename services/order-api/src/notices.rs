//! Order-confirmation notices: a side effect whose provider offers no
//! idempotency key (the mock notifier, `POST /v1/notices`).
//!
//! The saga writes an intent row (`notices`, PENDING) in the statement
//! that confirms the order (`crate::orders::write_batch`), so a confirmed
//! order always has one. This
//! worker leases pending rows for a while (`leased_until`: no transaction
//! is held across the provider's calls), sends their notices concurrently
//! and marks the rows SENT; a lease that runs out (its worker died) frees
//! its rows for another round.
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
    /// How long a claimed batch is the worker's own, in milliseconds: past it
    /// (the worker died, or its calls outlasted it) another worker sends
    /// those notices again. Longer than a round of calls takes.
    #[arg(long = "notice-lease-ms", env = "NOTICE_LEASE_MS", default_value_t = 30_000)]
    pub lease_ms: u64,
    /// Notices sent at once (each call waits for the provider).
    #[arg(long = "notice-concurrency", env = "NOTICE_CONCURRENCY", default_value_t = 16)]
    pub concurrency: usize,
}

impl NoticeArgs {
    /// The worker's period.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.max(1))
    }

    /// The lease of a claimed batch.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.max(1))
    }
}

/// Notices claimed per round.
const BATCH: i64 = 200;

/// Whatever sends a notice: the provider's client, or a test's stand-in.
pub trait Notifier: Sync {
    /// Sends the confirmation notice of `order`.
    fn notify(&self, order: Uuid) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;
}

impl Notifier for crate::gateway::Client {
    async fn notify(&self, order: Uuid) -> anyhow::Result<()> {
        Ok(crate::gateway::Client::notify(self, order).await?)
    }
}

/// One round: leases up to a batch of pending notices whose lease is free
/// (`FOR UPDATE SKIP LOCKED` inside one short statement: instances share the
/// work, and no transaction or lock is held while the provider is called),
/// sends them concurrently and marks them in the order `delivery` says.
/// Returns how many were sent.
pub async fn send_pending(pool: &PgPool, notifier: &impl Notifier, args: &NoticeArgs) -> anyhow::Result<usize> {
    let at_most_once = args.delivery == Delivery::AtMostOnce;
    let orders = claim(pool, args).await?;
    if orders.is_empty() {
        return Ok(0);
    }
    let labels = [("delivery", args.delivery.as_str())];
    if at_most_once {
        fail::fail_point!(CRASH_AFTER_MARK_BEFORE_SEND, |_| telemetry::crash_point(
            CRASH_AFTER_MARK_BEFORE_SEND
        ));
    }
    let results = send_all(notifier, &orders, args.concurrency).await;
    let (mut sent, mut failed) = (Vec::with_capacity(orders.len()), Vec::new());
    for (order, result) in results {
        match result {
            Ok(()) => {
                telemetry::metrics::incr("notices_sent_total", &labels);
                sent.push(order);
            }
            Err(e) if at_most_once => {
                // Marked already: a notice that fails now is lost, by choice.
                tracing::warn!(order_id = %order, error = %e, "notice lost (at-most-once)");
                telemetry::metrics::incr("notices_lost_total", &labels);
            }
            Err(e) => failed.push((order, e)),
        }
    }
    if at_most_once {
        return Ok(sent.len());
    }
    fail::fail_point!(CRASH_AFTER_SEND_BEFORE_MARK, |_| telemetry::crash_point(
        CRASH_AFTER_SEND_BEFORE_MARK
    ));
    mark_sent(pool, &sent).await?;
    // A failed send gives its lease back: the next round sends it again.
    let retry: Vec<Uuid> = failed.iter().map(|(o, _)| *o).collect();
    sqlx::query("UPDATE notices SET leased_until = NULL WHERE order_id = ANY($1) AND status = 'PENDING'")
        .bind(&retry)
        .execute(pool)
        .await?;
    if let Some((order, e)) = failed.into_iter().next() {
        return Err(e.context(format!(
            "notice of order {order} (and {} more) not sent",
            retry.len() - 1
        )));
    }
    Ok(sent.len())
}

/// Leases up to a batch of pending notices whose lease is free, in one
/// statement (its own transaction); at-most-once marks them SENT in it too
/// (mark, then send).
async fn claim(pool: &PgPool, args: &NoticeArgs) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar(
        "UPDATE notices SET leased_until = now() + $2 * interval '1 millisecond',
                status = CASE WHEN $3 THEN 'SENT' ELSE status END,
                sent_at = CASE WHEN $3 THEN now() ELSE sent_at END
         WHERE order_id IN (
             SELECT order_id FROM notices
             WHERE status = 'PENDING' AND (leased_until IS NULL OR leased_until < now())
             ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)
         RETURNING order_id",
    )
    .bind(BATCH)
    .bind(args.lease_ms.max(1) as f64)
    .bind(args.delivery == Delivery::AtMostOnce)
    .fetch_all(pool)
    .await
}

/// Sends the notices of `orders`, `concurrency` at a time; each result.
async fn send_all(notifier: &impl Notifier, orders: &[Uuid], concurrency: usize) -> Vec<(Uuid, anyhow::Result<()>)> {
    use futures::StreamExt as _;
    futures::stream::iter(orders.iter().copied())
        .map(|order| async move { (order, notifier.notify(order).await) })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

async fn mark_sent(pool: &PgPool, orders: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query("UPDATE notices SET status = 'SENT', sent_at = now(), leased_until = NULL WHERE order_id = ANY($1)")
        .bind(orders)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// A provider that counts what it receives, each call taking `delay`.
    struct Counting {
        got: Mutex<BTreeMap<Uuid, u32>>,
        delay: Duration,
    }

    impl Notifier for Counting {
        async fn notify(&self, order: Uuid) -> anyhow::Result<()> {
            tokio::time::sleep(self.delay).await;
            *self.got.lock().unwrap().entry(order).or_default() += 1;
            Ok(())
        }
    }

    /// The notices table as the orders migrations leave it (without the
    /// foreign key to orders: these tests have no orders).
    const NOTICES: &str = "CREATE TABLE notices (order_id uuid PRIMARY KEY,
        status text NOT NULL CHECK (status IN ('PENDING', 'SENT')),
        created_at timestamptz NOT NULL DEFAULT now(), sent_at timestamptz, leased_until timestamptz)";

    fn args(lease_ms: u64) -> NoticeArgs {
        NoticeArgs {
            delivery: Delivery::AtLeastOnce,
            interval_ms: 10,
            lease_ms,
            concurrency: 16,
        }
    }

    async fn pending(pool: &PgPool, n: usize) -> Vec<Uuid> {
        let orders: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        sqlx::query("INSERT INTO notices (order_id, status) SELECT unnest($1::uuid[]), 'PENDING'")
            .bind(&orders)
            .execute(pool)
            .await
            .unwrap();
        orders
    }

    /// Two workers at once share the notices, each sent by one of them
    /// once: a lease is taken in one statement with SKIP LOCKED, and a
    /// leased row is no other worker's until its lease runs out. Checked
    /// against the removal: without the lease condition in the claim
    /// (`AND (leased_until IS NULL OR …)`) notices went out twice.
    #[tokio::test]
    async fn two_workers_at_once_send_each_notice_once() {
        let (_db, pool) = testkit::db::TempDb::with_tables("eo_notices", vec![], NOTICES)
            .await
            .unwrap();
        let orders = pending(&pool, 300).await;
        let provider = Counting {
            got: Mutex::default(),
            delay: Duration::from_millis(5),
        };
        let worker = || async {
            let mut sent = 0;
            while let n @ 1.. = send_pending(&pool, &provider, &args(30_000)).await.unwrap() {
                sent += n;
            }
            sent
        };
        let (a, b) = tokio::join!(worker(), worker());
        assert_eq!(a + b, orders.len(), "{a} + {b}");
        let got = provider.got.lock().unwrap().clone();
        assert_eq!(got.len(), orders.len());
        assert!(got.values().all(|n| *n == 1), "a notice sent twice: {got:?}");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM notices WHERE status <> 'SENT'")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(left, 0);
        pool.close().await;
    }

    /// A worker that dies with a batch leased holds no lock and no
    /// transaction: the rows are free again once the lease runs out, and
    /// another worker sends them (at-least-once: a notice the dead worker
    /// had already sent goes out again).
    #[tokio::test]
    async fn a_dead_workers_lease_runs_out_and_another_sends_its_notices() {
        let (_db, pool) = testkit::db::TempDb::with_tables("eo_notices", vec![], NOTICES)
            .await
            .unwrap();
        let orders = pending(&pool, 5).await;
        // The first worker leases them for 300 ms, then dies.
        assert_eq!(claim(&pool, &args(300)).await.unwrap().len(), 5);
        let provider = Counting {
            got: Mutex::default(),
            delay: Duration::ZERO,
        };
        assert_eq!(
            send_pending(&pool, &provider, &args(300)).await.unwrap(),
            0,
            "still leased"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(send_pending(&pool, &provider, &args(300)).await.unwrap(), orders.len());
        assert_eq!(provider.got.lock().unwrap().len(), orders.len());
        pool.close().await;
    }
}
