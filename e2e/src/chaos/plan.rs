//! The order mix of a run, drawn from the seed: which orders, with which
//! keys, which are re-sent and which are cancelled.

use rand::rngs::StdRng;
use rand::Rng;
use uuid::Uuid;

use crate::driver::{OrderRequest, DECLINED_CARD, GOOD_CARD};

/// What a planned order is meant to become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Good card, stock available: CONFIRMED (or CANCELLED after a refund).
    Payable,
    /// The declined card: CANCELLED, stock released.
    Declined,
    /// More than the stock: CANCELLED, never charged.
    OutOfStock,
}

/// One order of the plan.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    /// What the order is meant to become.
    pub kind: Kind,
    /// Its Idempotency-Key.
    pub key: String,
    /// The request body.
    pub request: OrderRequest,
    /// Send it again after the acknowledgement (a client that lost the answer).
    pub resend: bool,
    /// Cancel it once CONFIRMED.
    pub cancel: bool,
}

/// `n` orders, drawn from `rng`: 80 % payable, 10 % declined, 10 % out of
/// stock. Each request's amount is its own — its number in the plan times
/// 100 plus a random 0–99 cents — a nonce the audit reads back from the
/// orders: two orders with one amount are two orders for one client request.
pub(super) fn plan(rng: &mut StdRng, n: usize) -> Vec<Planned> {
    (0..n)
        .map(|i| {
            let roll: f64 = rng.gen();
            let nonce = (i as i64 + 1) * 100 + rng.gen_range(0..100);
            let (kind, request) = if roll < 0.8 {
                let sku = if rng.gen_bool(0.5) { "WIDGET" } else { "GADGET" };
                (
                    Kind::Payable,
                    OrderRequest {
                        sku: sku.into(),
                        quantity: rng.gen_range(1..=3),
                        amount_cents: nonce,
                        card: GOOD_CARD.into(),
                    },
                )
            } else if roll < 0.9 {
                (
                    Kind::Declined,
                    OrderRequest {
                        sku: "WIDGET".into(),
                        quantity: 1,
                        amount_cents: nonce,
                        card: DECLINED_CARD.into(),
                    },
                )
            } else {
                (
                    Kind::OutOfStock,
                    OrderRequest {
                        sku: "RARE".into(),
                        quantity: 4,
                        amount_cents: nonce,
                        card: GOOD_CARD.into(),
                    },
                )
            };
            let key = Uuid::from_u128(rng.gen()).to_string();
            Planned {
                kind,
                key,
                request,
                resend: i % 10 == 3,
                cancel: kind == Kind::Payable && rng.gen_bool(0.05),
            }
        })
        .collect()
}
