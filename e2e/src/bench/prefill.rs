//! Tables as a deployment has them: before any trial, every table a purge
//! keeps short is filled with rows of two kinds, in one statement each.
//!
//! - **Ageing rows**: as many as `rate` orders a second would have left,
//!   stamped so that they pass their retention one after another over the
//!   next `ageing` (the bench's length): the purges delete rows at the
//!   rate a steady state at `rate` makes them, during the trials, and
//!   autovacuum follows the deletes.
//! - **A body**: `body_orders` orders' worth of rows within retention
//!   (never purged during the run), so indexes have a deployment's depth.
//!
//! A steady state at the retention defaults (idempotency keys a day, inbox
//! rows a week, published outbox rows three days, order history 90 days)
//! would hold a week of orders: 302 million inbox rows at 500 orders a
//! second, more than this machine's disk and hours to write. The body is
//! therefore a configured size, and the report gives each table's rows
//! beside what a steady state at the sustained rate would hold.

use std::time::{Duration, Instant};

use contract::topics::consumers::{self, Consumer};
use serde::Serialize;
use sqlx::Connection as _;

use crate::stack::Stack;

/// What to fill.
#[derive(Debug, Clone, Serialize)]
pub struct Prefill {
    /// Orders per second whose rows age out during the run.
    pub rate: f64,
    /// Over how long they age out.
    pub ageing_secs: u64,
    /// Orders' worth of rows within retention.
    pub body_orders: u64,
}

/// One table filled.
#[derive(Debug, Clone, Serialize)]
pub struct Filled {
    /// `database.table`.
    pub table: String,
    /// Rows per order in a steady state.
    pub rows_per_order: u64,
    /// The purge's retention (the service's default), seconds.
    pub retention_secs: u64,
    /// Rows written that age out during the run.
    pub ageing_rows: u64,
    /// Rows written within retention.
    pub body_rows: u64,
}

impl Filled {
    /// Rows a steady state at `rate` orders a second would hold.
    pub fn steady_state_rows(&self, rate: f64) -> f64 {
        rate * self.rows_per_order as f64 * self.retention_secs as f64
    }
}

/// A table: its database, its rows per order, its retention and the
/// statement writing `$1` rows whose timestamp `c` runs from `$2` to `$3`
/// seconds from now (`c` past `now() - retention` is purged); `{spread}`
/// in it stands for [`SPREAD`] (order_history's writes an order per row,
/// inside its CTE, and three history rows for each).
struct Table {
    db: &'static str,
    table: &'static str,
    rows_per_order: u64,
    retention_secs: u64,
    insert: String,
}

/// The rows' timestamps: `$1` rows, the g-th at now + `$2` + (`$3` − `$2`) × g / `$1` seconds.
const SPREAD: &str = "FROM generate_series(1, $1::bigint) g,
     LATERAL (SELECT now() + make_interval(secs => $2::float8 + ($3::float8 - $2::float8) * g / $1::bigint) AS c) t";

fn tables() -> Vec<Table> {
    // An inbox records the events its consumer applied under the consumer's name.
    let inbox = |db, consumer: Consumer, rows_per_order| Table {
        db,
        table: "inbox",
        rows_per_order,
        retention_secs: inbox::DEFAULT_RETENTION_SECS,
        insert: format!(
            "INSERT INTO inbox (consumer, event_id, processed_at) SELECT '{}', gen_random_uuid(), c {{spread}}",
            consumer.name
        ),
    };
    let outbox = |db, rows_per_order| Table {
        db,
        // Published rows leave the outbox; their records stay for the retention.
        table: "outbox_published",
        rows_per_order,
        retention_secs: outbox::DEFAULT_RETENTION_SECS,
        insert: "INSERT INTO outbox_published (event_id, topic, message_key, event_type, created_at,
                                               first_published_at, published_at, attempts)
                 SELECT gen_random_uuid(), 'order.events', gen_random_uuid()::text, 'Prefill', c, c, c, 1 {spread}"
            .into(),
    };
    vec![
        Table {
            db: "orders",
            table: "idempotency_keys",
            rows_per_order: 1,
            retention_secs: idempotency::DEFAULT_TTL_SECS,
            // A key expires (and is reaped) its TTL after it was written.
            insert: format!(
                "INSERT INTO idempotency_keys (scope, key, fingerprint, status_code, headers, body, created_at, expires_at)
                 SELECT 'bench-prefill', gen_random_uuid()::text, md5(g::text), 201, '{{}}'::jsonb,
                        convert_to(repeat('x', 400), 'UTF8'), c, c + make_interval(secs => {}) {{spread}}",
                idempotency::DEFAULT_TTL_SECS
            ),
        },
        Table {
            db: "orders",
            table: "order_history",
            rows_per_order: 3,
            retention_secs: order_api::DEFAULT_HISTORY_RETENTION_SECS,
            insert: "WITH o AS (
                         INSERT INTO orders (id, client_id, sku, quantity, amount_cents, card_token, card_last4, status, created_at, updated_at)
                         SELECT gen_random_uuid(), 'bench-prefill', 'SKU-' || lpad((g % 1000)::text, 4, '0'), 1, 1000,
                                'tok_prefill', '4242', 'CONFIRMED', c, c {spread}
                         RETURNING id, created_at)
                     INSERT INTO order_history (order_id, from_status, to_status, cause, event_id, applied, at)
                     SELECT o.id, s.f, s.t, s.cause, gen_random_uuid(), true, o.created_at
                     FROM o, (VALUES (NULL, 'PENDING', 'OrderPlaced'),
                                     ('PENDING', 'AWAITING_PAYMENT', 'StockReserved'),
                                     ('AWAITING_PAYMENT', 'CONFIRMED', 'PaymentCaptured')) s(f, t, cause)"
                .into(),
        },
        inbox("orders", consumers::ORDER_SAGA, 2),
        outbox("orders", 2),
        inbox("inventory", consumers::INVENTORY, 1),
        outbox("inventory", 1),
        inbox("payments", consumers::PAYMENT, 1),
        outbox("payments", 1),
    ]
}

/// Fills every table a purge keeps short on `stack` as `p` says, then ANALYZE.
pub async fn fill(stack: &Stack, p: &Prefill) -> anyhow::Result<Vec<Filled>> {
    fill_at(&|db| stack.db_url(db), p).await
}

/// [`fill`] on the databases `url` names (`orders`, `inventory`, `payments`).
async fn fill_at(url: &dyn Fn(&str) -> String, p: &Prefill) -> anyhow::Result<Vec<Filled>> {
    let started = Instant::now();
    let mut out = Vec::new();
    for t in tables() {
        let mut db = sqlx::PgConnection::connect(&url(t.db)).await?;
        let retention = t.retention_secs as f64;
        let ageing = p.ageing_secs as f64;
        // order_history's statement writes one order per generated row and
        // three history rows for it.
        let per_statement_row = if t.table == "order_history" {
            1
        } else {
            t.rows_per_order
        };
        let ageing_rows = (p.rate * ageing) as u64 * per_statement_row;
        let body_rows = p.body_orders * per_statement_row;
        for (n, from, to) in [
            (ageing_rows, -retention, -retention + ageing),
            (body_rows, -retention + ageing, 0.0),
        ] {
            if n == 0 {
                continue;
            }
            sqlx::query(&t.insert.replace("{spread}", SPREAD))
                .bind(i64::try_from(n)?)
                .bind(from)
                .bind(to)
                .execute(&mut db)
                .await
                .map_err(|e| anyhow::anyhow!("prefilling {}.{}: {e}", t.db, t.table))?;
        }
        sqlx::query(&format!("ANALYZE {}", t.table)).execute(&mut db).await?;
        db.close().await?;
        let factor = t.rows_per_order / per_statement_row;
        eprintln!(
            "bench: prefilled {}.{}: {} ageing + {} within retention",
            t.db,
            t.table,
            ageing_rows * factor,
            body_rows * factor
        );
        out.push(Filled {
            table: format!("{}.{}", t.db, t.table),
            rows_per_order: t.rows_per_order,
            retention_secs: t.retention_secs,
            ageing_rows: ageing_rows * factor,
            body_rows: body_rows * factor,
        });
    }
    eprintln!("bench: prefill took {:.0} s", started.elapsed().as_secs_f64());
    Ok(out)
}

/// How long the prefill's ageing rows take to age out by default: a full bench's length.
pub const DEFAULT_AGEING: Duration = Duration::from_secs(30 * 60);

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows left in `table` of `url`.
    async fn count(url: &str, table: &str) -> i64 {
        let mut db = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&mut db)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_ageing_rows_are_what_the_services_own_purges_delete_and_the_body_stays() {
        let dbs: Vec<testkit::TempDb> = ["orders", "inventory", "payments"]
            .iter()
            .map(|d| testkit::TempDb::new(&format!("eo_prefill_{d}")))
            .collect();
        order_api::connect(dbs[0].url(), 2).await.unwrap();
        // payments' inbox and outbox are the same crates' tables.
        inventory_service::connect(dbs[1].url(), 2).await.unwrap();
        inventory_service::connect(dbs[2].url(), 2).await.unwrap();
        let url = |db: &str| match db {
            "orders" => dbs[0].url().to_owned(),
            "inventory" => dbs[1].url().to_owned(),
            _ => dbs[2].url().to_owned(),
        };
        // 10 orders a second ageing out over 2 s (20 orders' rows), a body of 7.
        let p = Prefill {
            rate: 10.0,
            ageing_secs: 2,
            body_orders: 7,
        };
        let filled = fill_at(&url, &p).await.unwrap();
        let history = filled.iter().find(|f| f.table == "orders.order_history").unwrap();
        assert_eq!((history.ageing_rows, history.body_rows), (60, 21));
        assert_eq!(count(dbs[0].url(), "orders").await, 27);
        assert_eq!(count(dbs[0].url(), "inbox").await, 54);

        // After the ageing time every ageing row has passed its retention,
        // and the purges take exactly those.
        let pool = sqlx::PgPool::connect(dbs[0].url()).await.unwrap();
        // (The first ageing rows pass theirs at once: they are spread from now on.)
        let early = idempotency::reap(&pool, 1_000).await.unwrap();
        assert!(early < 10, "{early} reaped before their time");
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(early + idempotency::reap(&pool, 1_000).await.unwrap(), 20);
        let mut conn = pool.acquire().await.unwrap();
        let week = Duration::from_secs(inbox::DEFAULT_RETENTION_SECS);
        assert_eq!(inbox::purge(&mut conn, week, 1_000).await.unwrap(), 40);
        let purged = order_api::orders::purge_history(
            &mut conn,
            Duration::from_secs(order_api::DEFAULT_HISTORY_RETENTION_SECS),
            1_000,
        )
        .await
        .unwrap();
        assert_eq!(purged, 60);
        let published: u64 =
            sqlx::query("DELETE FROM outbox_published WHERE published_at < now() - make_interval(secs => $1)")
                .bind(outbox::DEFAULT_RETENTION_SECS as f64)
                .execute(&mut *conn)
                .await
                .unwrap()
                .rows_affected();
        assert_eq!(published, 40);
        for (table, left) in [
            ("idempotency_keys", 7),
            ("inbox", 14),
            ("order_history", 21),
            ("outbox_published", 14),
        ] {
            assert_eq!(count(dbs[0].url(), table).await, left, "{table}");
        }
        let mut inv = sqlx::PgConnection::connect(dbs[1].url()).await.unwrap();
        assert_eq!(inbox::purge(&mut inv, week, 1_000).await.unwrap(), 20);
        assert_eq!(count(dbs[1].url(), "inbox").await, 7);
    }
}
