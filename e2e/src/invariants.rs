//! The invariants of docs/design.md, checked against the databases and the gateway
//! ledger after the system has drained. Each violated invariant becomes one
//! line in [`Audit::violations`]; an empty list is a pass.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::stack::Stack;

mod rescued;
use rescued::check_rescued;
pub use rescued::{rescued, Rescued};

/// The invariants, by the names reports and tests use.
pub const ORDER_PER_KEY: &str = "one order per key";
/// Money.
pub const CHARGED_ONCE: &str = "charged once";
/// Stock.
pub const STOCK_CONSERVED: &str = "stock conserved";
/// Each consumer applies each event once; a repeat must stop at the inbox.
pub const STEP_ONCE: &str = "each saga step applied once";
/// Every acknowledged order exists.
pub const NOTHING_LOST: &str = "nothing lost";
/// Everything reaches a terminal state; every outbox row is published.
pub const NOTHING_STUCK: &str = "nothing stuck";

/// What the driver knows independently of the system under test.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// Stock seeded per SKU.
    pub initial_stock: BTreeMap<String, i64>,
    /// Every order acknowledged with 2xx: idempotency key → order id.
    pub acknowledged: BTreeMap<String, Uuid>,
    /// Orders whose outcome the client never learned (it gave up retrying):
    /// each may or may not exist, at most once.
    pub indeterminate: usize,
    /// Orders whose message the run loses on purpose (a dead-lettered
    /// command, a participant kept down past the deadline): exactly these
    /// may be finished by the reconciler. Empty for a run whose faults
    /// cannot lose a message.
    pub rescue_expected: BTreeSet<Uuid>,
    /// Every client request carried a number of its own in its amount (a
    /// nonce): then two orders with one amount are two orders for one request.
    pub amount_is_nonce: bool,
    /// The run reads back which copy each inbox applied (the chaos suite):
    /// an order only re-sent to is then judged by the log, not by its re-send
    /// ([`Audit::late_not_lost`]). Without the log, every re-send is a rescue.
    pub resends_judged_by_the_log: bool,
}

/// The audit of one run.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Audit {
    /// Orders per status.
    pub orders_by_status: BTreeMap<String, i64>,
    /// Captured charges in the ledger.
    pub captures: i64,
    /// Declined charges in the ledger.
    pub declines: i64,
    /// Refunds in the ledger.
    pub refunds: i64,
    /// Orders with more than one capture.
    pub double_charged: Vec<Uuid>,
    /// Acknowledged orders that do not exist.
    pub lost: Vec<Uuid>,
    /// Orders not in a terminal state.
    pub stuck: Vec<Uuid>,
    /// Outbox rows not yet published, across all service databases.
    pub unpublished_outbox_rows: i64,
    /// Outbox rows parked as unpublishable.
    pub parked_outbox_rows: i64,
    /// Per SKU: (initial, available, reserved by live orders).
    pub stock: BTreeMap<String, (i64, i64, i64)>,
    /// Events each consumer's inbox let through although their effect was
    /// already applied (a business key caught them): `inbox_misses` rows,
    /// per consumer and per business key that caught the repeat.
    pub inbox_misses: BTreeMap<String, BTreeMap<String, i64>>,
    /// Orders the deadline reconciler had to act on, per action (the
    /// history's cause: `Resent:<command>`, `Reconciled:<reply>`,
    /// `DeadlineExceeded`): each is a message that did not arrive in time.
    pub rescued: BTreeMap<String, BTreeSet<Uuid>>,
    /// The history rows behind [`Audit::rescued`] (the first 20), as evidence.
    pub rescue_evidence: Vec<String>,
    /// Orders only re-sent to, or reconciled before their reply arrived,
    /// per action, whose first copy the log shows applied: late past the
    /// deadline (overlapping faults), not lost. (A later copy applied makes
    /// the order a rescue instead.)
    pub late_not_lost: BTreeMap<String, BTreeSet<Uuid>>,
    /// Messages lost before the log, read from the outboxes, the orders'
    /// history and the broker's append times: a row marked published with
    /// no copy in its topic before the mark, or a command re-sent that
    /// existed nowhere before its re-send. How many, and the first 20 in words.
    pub lost_before_the_log: usize,
    /// See [`Audit::lost_before_the_log`].
    pub lost_before_the_log_evidence: Vec<String>,
    /// Events in the broker's log their consumer's inbox does not hold
    /// (its group committed past them: acknowledged, never handled).
    pub never_handled: usize,
    /// Inbox rows whose effect (a reservation movement, a payment
    /// operation, a saga transition) is absent.
    pub handled_without_effect: usize,
    /// Effects whose event no inbox row records.
    pub effect_without_inbox: usize,
    /// Inbox rows that name no copy in the log.
    pub inbox_without_source: usize,
    /// Events applied from a later copy than the first their consumer was
    /// delivered (the first copy's effect lost).
    pub applied_from_later_copy: usize,
    /// The first few findings of the four checks above, in words.
    pub effects_evidence: Vec<String>,
    /// When each broken invariant's first evidence was written (an inbox
    /// miss, a reconciler's history row, a second capture, a stuck order's
    /// creation), by invariant name: where a picture marks it.
    pub first_seen: BTreeMap<String, chrono::DateTime<chrono::Utc>>,
    /// Client requests (told apart by the nonce in their amount) that made
    /// more than one order.
    pub requests_with_two_orders: usize,
    /// Replies that reached the saga's state machine more than once, read
    /// from `order_history` (per order, a reply's event type at most once).
    pub replies_applied_twice: usize,
    /// Events the broker's log shows answered twice: one event that caused
    /// two distinct events of one type (filled in from the log after the
    /// database audit, by the chaos suite).
    pub events_answered_twice: usize,
    /// Gateway idempotency keys with more than one ledger entry.
    pub ledger_keys_repeated: usize,
    /// Reservations whose status does not match their order's final state.
    pub reservations_mismatched: usize,
    /// Every broken invariant, in words.
    pub violations: Vec<String>,
}

impl Audit {
    /// Keeps the earliest evidence of `invariant` breaking.
    pub fn seen(&mut self, invariant: &str, at: Option<chrono::DateTime<chrono::Utc>>) {
        if let Some(at) = at {
            let first = self.first_seen.entry(invariant.to_owned()).or_insert(at);
            *first = (*first).min(at);
        }
    }

    /// Whether every invariant holds.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

async fn connect(url: &str) -> anyhow::Result<PgConnection> {
    Ok(PgConnection::connect(url).await?)
}

/// Checks every invariant.
pub async fn audit(stack: &Stack, expected: &Expected) -> anyhow::Result<Audit> {
    let mut a = Audit::default();
    let mut orders_db = connect(&stack.db_url("orders")).await?;
    let mut gateway_db = connect(&stack.db_url("gateway")).await?;
    let mut inventory_db = connect(&stack.db_url("inventory")).await?;

    let orders: Vec<OrderRow> = sqlx::query_as("SELECT id, status, amount_cents, sku, quantity FROM orders")
        .fetch_all(&mut orders_db)
        .await?;
    let known: BTreeSet<Uuid> = orders.iter().map(|o| o.0).collect();
    for (_, status, ..) in &orders {
        *a.orders_by_status.entry(status.clone()).or_default() += 1;
    }

    // Ledger: the ground truth of money.
    let ledger: Vec<(Uuid, String, String, i64)> =
        sqlx::query_as("SELECT order_id, kind, status, amount_cents FROM ledger")
            .fetch_all(&mut gateway_db)
            .await?;
    let mut captures: BTreeMap<Uuid, (i64, i64)> = BTreeMap::new(); // order → (count, cents)
    let mut refunded: BTreeMap<Uuid, i64> = BTreeMap::new();
    for (order, kind, status, cents) in &ledger {
        match (kind.as_str(), status.as_str()) {
            ("charge", "captured") => {
                a.captures += 1;
                let e = captures.entry(*order).or_default();
                e.0 += 1;
                e.1 += cents;
            }
            ("charge", _) => a.declines += 1,
            _ => {
                a.refunds += 1;
                *refunded.entry(*order).or_default() += cents;
            }
        }
        if !known.contains(order) {
            a.violations
                .push(format!("{CHARGED_ONCE}: ledger entry for unknown order {order}"));
        }
    }
    for (order, (count, _)) in &captures {
        if *count > 1 {
            a.double_charged.push(*order);
        }
    }
    if !a.double_charged.is_empty() {
        let first: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
            "SELECT min(created_at) FROM (
                 SELECT created_at, row_number() OVER (PARTITION BY order_id ORDER BY created_at) AS n
                 FROM ledger WHERE kind = 'charge' AND status = 'captured') c
             WHERE n = 2",
        )
        .fetch_one(&mut gateway_db)
        .await?;
        a.seen(CHARGED_ONCE, first);
        a.violations.push(format!(
            "{CHARGED_ONCE}: {} orders captured more than once",
            a.double_charged.len()
        ));
    }
    let mut wrong_net = 0;
    for (id, status, amount, ..) in &orders {
        let net = captures.get(id).map_or(0, |c| c.1) - refunded.get(id).copied().unwrap_or(0);
        let want = match status.as_str() {
            "CONFIRMED" => *amount,
            "CANCELLED" => 0,
            _ => continue,
        };
        if net != want {
            wrong_net += 1;
        }
    }
    if wrong_net > 0 {
        a.violations.push(format!(
            "{CHARGED_ONCE}: {wrong_net} terminal orders whose ledger net is wrong (CONFIRMED ≠ amount or CANCELLED ≠ 0)"
        ));
    }

    // Nothing lost, nothing stuck, one order per key.
    let acked: BTreeSet<Uuid> = expected.acknowledged.values().copied().collect();
    a.lost = acked.difference(&known).copied().collect();
    if !a.lost.is_empty() {
        a.violations
            .push(format!("{NOTHING_LOST}: {} acknowledged orders lost", a.lost.len()));
    }
    a.stuck = orders
        .iter()
        .filter(|o| o.1 != "CONFIRMED" && o.1 != "CANCELLED")
        .map(|o| o.0)
        .collect();
    if !a.stuck.is_empty() {
        let first: Option<chrono::DateTime<chrono::Utc>> =
            sqlx::query_scalar("SELECT min(created_at) FROM orders WHERE status NOT IN ('CONFIRMED', 'CANCELLED')")
                .fetch_one(&mut orders_db)
                .await?;
        a.seen(NOTHING_STUCK, first);
        a.violations.push(format!(
            "{NOTHING_STUCK}: {} orders stuck in a non-terminal state",
            a.stuck.len()
        ));
    }
    if acked.len() != expected.acknowledged.len() {
        a.violations.push(format!(
            "{ORDER_PER_KEY}: two idempotency keys were acknowledged with the same order"
        ));
    }
    order_per_key(&mut orders_db, expected, &known, &mut a).await?;
    let mut payments_db = connect(&stack.db_url("payments")).await?;
    check_rescued(&mut orders_db, &mut payments_db, expected, &mut a).await?;
    let most = expected.acknowledged.len() + expected.indeterminate;
    if orders.len() < expected.acknowledged.len() || orders.len() > most {
        a.violations.push(format!(
            "{ORDER_PER_KEY}: {} orders in the database for {} acknowledged and {} indeterminate keys",
            orders.len(),
            expected.acknowledged.len(),
            expected.indeterminate
        ));
    }

    ground_truth(
        &mut a,
        expected,
        &orders,
        [&mut orders_db, &mut gateway_db, &mut inventory_db],
    )
    .await?;

    // Each saga step applied once: a repeated event stops at the inbox, so
    // no business key ever has to catch one.
    for db in ["orders", "inventory", "payments"] {
        let mut c = connect(&stack.db_url(db)).await?;
        let misses: Vec<(String, String, i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
            "SELECT consumer, caught_by, count(*)::int8, min(seen_at) FROM inbox_misses GROUP BY consumer, caught_by",
        )
        .fetch_all(&mut c)
        .await?;
        for (consumer, caught_by, n, first) in misses {
            a.seen(STEP_ONCE, Some(first));
            a.violations.push(format!(
                "{STEP_ONCE}: {n} events reached {consumer}'s effect again (its inbox let them through; \
                 the {caught_by} caught them)"
            ));
            a.inbox_misses.entry(consumer).or_default().insert(caught_by, n);
        }
    }

    // Every committed outbox row published.
    for db in ["orders", "inventory", "payments"] {
        let mut c = connect(&stack.db_url(db)).await?;
        let (pending, parked): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE parked_at IS NULL),
                    count(*) FILTER (WHERE parked_at IS NOT NULL) FROM outbox",
        )
        .fetch_one(&mut c)
        .await?;
        a.unpublished_outbox_rows += pending;
        a.parked_outbox_rows += parked;
    }
    if a.unpublished_outbox_rows > 0 || a.parked_outbox_rows > 0 {
        a.violations.push(format!(
            "{NOTHING_STUCK}: outbox not drained: {} pending, {} parked",
            a.unpublished_outbox_rows, a.parked_outbox_rows
        ));
    }

    // Stock conservation: initial = available + reserved(live), and what is
    // reserved is exactly what CONFIRMED orders hold.
    let levels: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT s.sku, s.available::int8,
                COALESCE((SELECT sum(quantity) FROM reservations r WHERE r.sku = s.sku AND r.status = 'RESERVED'), 0)::int8
         FROM stock s",
    )
    .fetch_all(&mut inventory_db)
    .await?;
    let mut confirmed_qty: BTreeMap<&str, i64> = BTreeMap::new();
    for (_, status, _, sku, qty) in &orders {
        if status == "CONFIRMED" {
            *confirmed_qty.entry(sku.as_str()).or_default() += i64::from(*qty);
        }
    }
    for (sku, available, reserved) in levels {
        let initial = expected.initial_stock.get(&sku).copied().unwrap_or(0);
        if available < 0 || available + reserved != initial {
            a.violations.push(format!(
                "{STOCK_CONSERVED}: {sku}: initial {initial} ≠ available {available} + reserved {reserved}"
            ));
        }
        let held = confirmed_qty.get(sku.as_str()).copied().unwrap_or(0);
        if reserved != held {
            a.violations.push(format!(
                "{STOCK_CONSERVED}: {sku}: {reserved} reserved but CONFIRMED orders hold {held}"
            ));
        }
        a.stock.insert(sku, (initial, available, reserved));
    }
    Ok(a)
}

/// An order row: id, status, amount, sku, quantity.
type OrderRow = (Uuid, String, i64, String, i32);

/// The checks read from domain rows alone, whatever the services count
/// about themselves: one order per client request, each reply applied once
/// by the state machine, one ledger entry per gateway key, and each
/// reservation in the state its order's outcome needs.
async fn ground_truth(
    a: &mut Audit,
    expected: &Expected,
    orders: &[OrderRow],
    [orders_db, gateway_db, inventory_db]: [&mut PgConnection; 3],
) -> anyhow::Result<()> {
    if expected.amount_is_nonce {
        let mut per_amount: BTreeMap<i64, usize> = BTreeMap::new();
        for (_, _, amount, ..) in orders {
            *per_amount.entry(*amount).or_default() += 1;
        }
        a.requests_with_two_orders = per_amount.values().filter(|n| **n > 1).count();
        if a.requests_with_two_orders > 0 {
            a.violations.push(format!(
                "{ORDER_PER_KEY}: {} client requests made more than one order (each request's amount is its own)",
                a.requests_with_two_orders
            ));
        }
    }
    // A reply reaches the state machine once: its history row (applied or
    // ignored) is written in the transaction of its inbox row. Two rows of
    // one reply type for one order are a repeat some inbox let through.
    let (repeats, first): (i64, Option<chrono::DateTime<chrono::Utc>>) = sqlx::query_as(
        "SELECT count(*)::int8, min(second_at) FROM (
             SELECT order_id, cause, (array_agg(at ORDER BY id))[2] AS second_at FROM order_history
             WHERE cause IN ('StockReserved', 'StockRejected', 'StockReleased', 'PaymentCaptured',
                             'PaymentDeclined', 'PaymentRefunded', 'RefundFailed')
             GROUP BY order_id, cause HAVING count(*) > 1) r",
    )
    .fetch_one(&mut *orders_db)
    .await?;
    a.replies_applied_twice = repeats as usize;
    if repeats > 0 {
        a.seen(STEP_ONCE, first);
        a.violations.push(format!(
            "{STEP_ONCE}: {repeats} replies reached the saga's state machine twice (order_history)"
        ));
    }
    let repeated: i64 = sqlx::query_scalar(
        "SELECT count(*)::int8 FROM (SELECT 1 FROM ledger GROUP BY idempotency_key HAVING count(*) > 1) k",
    )
    .fetch_one(&mut *gateway_db)
    .await?;
    a.ledger_keys_repeated = repeated as usize;
    if repeated > 0 {
        a.violations.push(format!(
            "{CHARGED_ONCE}: {repeated} gateway keys with more than one ledger entry"
        ));
    }
    // Stock, order by order: a CONFIRMED order holds its reservation, a
    // CANCELLED one holds none.
    let reservations: BTreeMap<Uuid, (String, i32, String)> =
        sqlx::query_as::<_, (Uuid, String, i32, String)>("SELECT order_id, sku, quantity, status FROM reservations")
            .fetch_all(&mut *inventory_db)
            .await?
            .into_iter()
            .map(|(id, sku, qty, status)| (id, (sku, qty, status)))
            .collect();
    let mut mismatched = Vec::new();
    for (id, status, _, sku, qty) in orders {
        let held = reservations.get(id);
        let right = match (status.as_str(), held) {
            ("CONFIRMED", Some((s, q, r))) => s == sku && q == qty && r == "RESERVED",
            ("CONFIRMED", None) => false,
            ("CANCELLED", Some((_, _, r))) => r != "RESERVED",
            ("CANCELLED", None) => true,
            _ => true, // not terminal: reported as stuck
        };
        if !right {
            mismatched.push(format!("order {id} {status}, reservation {held:?}"));
        }
    }
    let unknown = reservations
        .keys()
        .filter(|id| !orders.iter().any(|o| o.0 == **id))
        .count();
    a.reservations_mismatched = mismatched.len() + unknown;
    if a.reservations_mismatched > 0 {
        a.violations.push(format!(
            "{STOCK_CONSERVED}: {} reservations do not match their order's outcome, {unknown} of unknown orders (first: {})",
            mismatched.len(),
            mismatched.first().map_or("-", String::as_str)
        ));
    }
    Ok(())
}

/// One order per key, key by key, from the stored Idempotency-Key
/// responses (each written in the transaction that created its order):
/// every acknowledged key's stored 201 names the order the client was
/// given, and every order in the database is named by exactly one key.
async fn order_per_key(
    db: &mut PgConnection,
    expected: &Expected,
    known: &BTreeSet<Uuid>,
    a: &mut Audit,
) -> anyhow::Result<()> {
    let violations = &mut a.violations;
    let stored: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT key, body FROM idempotency_keys WHERE status_code = 201")
            .fetch_all(&mut *db)
            .await?;
    let mut named: BTreeMap<String, Uuid> = BTreeMap::new();
    let mut keys_per_order: BTreeMap<Uuid, usize> = BTreeMap::new();
    for (key, body) in stored {
        match serde_json::from_slice::<crate::driver::OrderView>(&body).map(|o| o.id) {
            Ok(id) => {
                *keys_per_order.entry(id).or_default() += 1;
                named.insert(key, id);
            }
            Err(_) => violations.push(format!("{ORDER_PER_KEY}: key {key}'s stored 201 names no order")),
        }
    }
    let mut wrong = Vec::new();
    for (key, id) in &expected.acknowledged {
        match named.get(key) {
            Some(stored) if stored == id => {}
            Some(stored) => wrong.push(format!("key {key}: acknowledged order {id}, stored {stored}")),
            None => wrong.push(format!("key {key}: acknowledged order {id}, no stored response")),
        }
    }
    if !wrong.is_empty() {
        violations.push(format!(
            "{ORDER_PER_KEY}: {} acknowledged keys whose stored response is not their order (first: {})",
            wrong.len(),
            wrong[0]
        ));
    }
    let unnamed: Vec<Uuid> = known
        .iter()
        .filter(|id| !keys_per_order.contains_key(id))
        .copied()
        .collect();
    let shared = keys_per_order.values().filter(|n| **n > 1).count();
    if !unnamed.is_empty() || shared > 0 {
        violations.push(format!(
            "{ORDER_PER_KEY}: {} orders no key created, {shared} named by more than one key",
            unnamed.len()
        ));
        let first: Option<chrono::DateTime<chrono::Utc>> =
            sqlx::query_scalar("SELECT min(created_at) FROM orders WHERE id = ANY($1)")
                .bind(&unnamed)
                .fetch_one(&mut *db)
                .await?;
        a.seen(ORDER_PER_KEY, first);
    }
    Ok(())
}
