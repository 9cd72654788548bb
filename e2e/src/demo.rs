//! The demo workload: a mix of payable, declined and out-of-stock orders,
//! placed concurrently with Idempotency-Keys (some sent twice on purpose),
//! driven to their terminal states and audited.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::driver::{new_key, Client, OrderRequest, DECLINED_CARD, GOOD_CARD};
use crate::invariants::{audit, Audit, Expected};
use crate::stack::Stack;

/// What kind of order the driver meant to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Enough stock, good card: should be CONFIRMED.
    Payable,
    /// The gateway declines the card: CANCELLED, stock released.
    Declined,
    /// More than the SKU has: CANCELLED, never charged.
    OutOfStock,
}

/// Sizes of the demo workload.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Orders expected to be CONFIRMED.
    pub payable: usize,
    /// Orders with the declined card.
    pub declined: usize,
    /// Orders for more than the scarce SKU holds.
    pub out_of_stock: usize,
}

/// The outcome of a demo run.
#[derive(Debug)]
pub struct Outcome {
    /// Every placed order with its intended kind and final view.
    pub orders: Vec<(Kind, crate::driver::OrderView)>,
    /// Responses replayed by the Idempotency-Key layer for deliberate retries.
    pub replays: usize,
    /// The audit.
    pub audit: Audit,
    /// Stock before (per SKU).
    pub stock_before: BTreeMap<String, (i64, i64)>,
    /// Stock after (per SKU).
    pub stock_after: BTreeMap<String, (i64, i64)>,
    /// Wall time from the first order to the last terminal state.
    pub elapsed: Duration,
}

/// The SKUs and their initial stock.
pub const STOCK: [(&str, i32); 3] = [("WIDGET", 500), ("GADGET", 500), ("RARE", 3)];

/// Seeds stock, places the mix concurrently, waits for terminal states and audits.
pub async fn run(stack: &Stack, mix: Mix) -> anyhow::Result<Outcome> {
    let client = Client::new(stack, Duration::from_secs(10))?;
    for (sku, n) in STOCK {
        client.seed_stock(sku, n).await?;
    }
    let stock_before = client.stock().await?;
    let mut plan = Vec::new();
    for i in 0..mix.payable {
        let sku = if i % 2 == 0 { "WIDGET" } else { "GADGET" };
        plan.push((
            Kind::Payable,
            OrderRequest {
                sku: sku.into(),
                quantity: 1 + (i % 3) as i32,
                amount_cents: 1_000 + 10 * i as i64,
                card: GOOD_CARD.into(),
            },
        ));
    }
    for _ in 0..mix.declined {
        plan.push((
            Kind::Declined,
            OrderRequest {
                sku: "WIDGET".into(),
                quantity: 2,
                amount_cents: 2_500,
                card: DECLINED_CARD.into(),
            },
        ));
    }
    for _ in 0..mix.out_of_stock {
        plan.push((
            Kind::OutOfStock,
            OrderRequest {
                sku: "RARE".into(),
                quantity: 4,
                amount_cents: 9_900,
                card: GOOD_CARD.into(),
            },
        ));
    }
    let started = Instant::now();
    let placed = futures::future::join_all(plan.into_iter().enumerate().map(|(i, (kind, req))| {
        let client = client.clone();
        async move {
            let key = new_key();
            let order = client.place_order(&key, &req, Duration::from_secs(30)).await?;
            // Every fourth order is sent again with the same key, as a client
            // that never saw the first response would: same order, replayed.
            let mut replayed = false;
            if i % 4 == 0 {
                let again = client.post_order(&key, &req).await?;
                let same: crate::driver::OrderView = serde_json::from_str(&again.body)?;
                anyhow::ensure!(
                    again.status == 201 && same.id == order.id,
                    "retry with the same key made a new order"
                );
                replayed = again.replayed;
            }
            anyhow::Ok((kind, key, order, replayed))
        }
    }))
    .await
    .into_iter()
    .collect::<anyhow::Result<Vec<_>>>()?;
    let ids: Vec<Uuid> = placed.iter().map(|p| p.2.id).collect();
    let finals = client.wait_terminal(&ids, Duration::from_secs(90)).await?;
    let elapsed = started.elapsed();
    let expected = Expected {
        initial_stock: STOCK.iter().map(|(s, n)| ((*s).to_owned(), i64::from(*n))).collect(),
        acknowledged: placed.iter().map(|p| (p.1.clone(), p.2.id)).collect(),
        indeterminate: 0,
        rescue_expected: Default::default(),
        resends_judged_by_the_log: false,
        amount_is_nonce: false,
    };
    let audit = audit(stack, &expected).await?;
    Ok(Outcome {
        orders: placed.iter().map(|p| (p.0, finals[&p.2.id].clone())).collect(),
        replays: placed.iter().filter(|p| p.3).count(),
        audit,
        stock_before,
        stock_after: client.stock().await?,
        elapsed,
    })
}

impl Outcome {
    /// Orders of `kind` whose final status is `status`.
    pub fn count(&self, kind: Kind, status: &str) -> usize {
        self.orders
            .iter()
            .filter(|(k, o)| *k == kind && o.status == status)
            .count()
    }

    /// Human summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "orders placed: {} in {:.1?} (to last terminal state)",
            self.orders.len(),
            self.elapsed
        );
        for (kind, label) in [
            (Kind::Payable, "payable"),
            (Kind::Declined, "declined card"),
            (Kind::OutOfStock, "out of stock"),
        ] {
            let _ = writeln!(
                s,
                "  {label:<14} CONFIRMED {:>3}   CANCELLED {:>3}",
                self.count(kind, "CONFIRMED"),
                self.count(kind, "CANCELLED")
            );
        }
        let _ = writeln!(s, "orders by status: {:?}", self.audit.orders_by_status);
        let _ = writeln!(s, "idempotent retries replayed: {}", self.replays);
        let _ = writeln!(
            s,
            "gateway ledger: {} captures, {} declines, {} refunds; orders charged twice: {}",
            self.audit.captures,
            self.audit.declines,
            self.audit.refunds,
            self.audit.double_charged.len()
        );
        let _ = writeln!(s, "stock (available, reserved) before: {:?}", self.stock_before);
        let _ = writeln!(s, "stock (available, reserved) after:  {:?}", self.stock_after);
        if self.audit.passed() {
            let _ = writeln!(s, "invariants: all hold");
        } else {
            let _ = writeln!(s, "invariants VIOLATED:");
            for v in &self.audit.violations {
                let _ = writeln!(s, "  - {v}");
            }
        }
        s
    }

    /// Checks the three endings besides the invariants.
    pub fn check_endings(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.audit.passed(), "invariants violated: {:?}", self.audit.violations);
        let n = |k| self.orders.iter().filter(|(kind, _)| *kind == k).count();
        anyhow::ensure!(
            self.count(Kind::Payable, "CONFIRMED") == n(Kind::Payable),
            "not every payable order was confirmed"
        );
        anyhow::ensure!(
            self.count(Kind::Declined, "CANCELLED") == n(Kind::Declined),
            "not every declined order was cancelled"
        );
        anyhow::ensure!(
            self.count(Kind::OutOfStock, "CANCELLED") == n(Kind::OutOfStock),
            "not every out-of-stock order was cancelled"
        );
        Ok(())
    }
}
