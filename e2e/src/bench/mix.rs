//! What the bench's orders are: the deployment's mix (many SKUs, a fresh
//! card per order so every order pays its tokenise call, a share of
//! orders cancelled after they are confirmed — a refund each — and
//! several API keys, so idempotency keys live in several scopes), or the
//! single shape of the earlier figures (one SKU, one card, one key).

use std::time::Duration;

use rand::Rng;
use serde::Serialize;

use crate::driver::{Client, OrderRequest, GOOD_CARD};
use crate::stack::Stack;

/// The orders a bench sends.
#[derive(Debug, Clone, Serialize)]
pub struct Mix {
    /// SKUs, each seeded with stock that never runs out.
    pub skus: usize,
    /// A new card number per order (tokenised each time), or [`GOOD_CARD`]
    /// for every order (tokenised once, then order-api's cache answers).
    pub distinct_cards: bool,
    /// Share of orders cancelled [`CANCEL_AFTER`] their intended send
    /// (then confirmed: payment refunds them; else stock is released).
    pub cancel_share: f64,
    /// API keys the orders are spread over.
    pub api_keys: usize,
}

impl Mix {
    /// One SKU, one card, one key, no cancels: the earlier benches' shape.
    pub fn single() -> Self {
        Self {
            skus: 1,
            distinct_cards: false,
            cancel_share: 0.0,
            api_keys: 1,
        }
    }

    /// The deployment's shape: 1,000 SKUs, a card per order, 10 % cancelled
    /// (refunded), four API keys.
    pub fn realistic() -> Self {
        Self {
            skus: 1_000,
            distinct_cards: true,
            cancel_share: 0.1,
            api_keys: 4,
        }
    }

    /// `single` or `realistic`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "single" => Ok(Self::single()),
            "realistic" => Ok(Self::realistic()),
            other => Err(format!("unknown mix {other:?}: single or realistic")),
        }
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        format!(
            "{} SKU(s), {}, {:.0} % cancelled after {} s, {} API key(s)",
            self.skus,
            if self.distinct_cards {
                "a new card per order (tokenised)"
            } else {
                "one card (tokenised once)"
            },
            self.cancel_share * 100.0,
            CANCEL_AFTER.as_secs(),
            self.api_keys
        )
    }
}

/// How long after its intended send a cancelled order's cancel is sent:
/// long enough that the order is usually CONFIRMED, so it is refunded.
pub const CANCEL_AFTER: Duration = Duration::from_secs(1);

/// Stock per SKU: never the limit.
const STOCK: i32 = 2_000_000_000;

/// The bench's clients (one per API key) and what they send.
#[derive(Clone)]
pub struct Load {
    clients: Vec<Client>,
    /// The mix.
    pub mix: Mix,
}

impl Load {
    /// Seeds every SKU of `mix` and provisions its API keys (the first is
    /// `client`'s own).
    pub async fn prepare(stack: &Stack, client: &Client, mix: Mix) -> anyhow::Result<Self> {
        for s in 0..mix.skus {
            client.seed_stock(&sku(s, mix.skus), STOCK).await?;
        }
        let mut clients = vec![client.clone()];
        for k in 1..mix.api_keys.max(1) {
            let mut other = client.clone();
            other.api_key = stack.create_api_key(&format!("bench-{k}")).await?;
            clients.push(other);
        }
        Ok(Self { clients, mix })
    }

    /// A load of `mix` on `client` alone, stock seeded elsewhere (tests).
    pub fn on(client: &Client, mix: Mix) -> Self {
        Self {
            clients: vec![client.clone()],
            mix,
        }
    }

    /// The `i`th order: its client, what it asks, and whether it is to be cancelled.
    pub fn order(&self, i: usize) -> (&Client, OrderRequest, bool) {
        let (order, cancel) = self.mix.draw(&mut rand::thread_rng());
        (&self.clients[i % self.clients.len()], order, cancel)
    }
}

impl Mix {
    /// An order of this mix, and whether it is to be cancelled.
    pub fn draw(&self, rng: &mut impl Rng) -> (OrderRequest, bool) {
        let order = OrderRequest {
            sku: sku(rng.gen_range(0..self.skus.max(1)), self.skus),
            quantity: 1,
            amount_cents: if self.skus > 1 {
                rng.gen_range(100..=100_000)
            } else {
                1_000
            },
            card: if self.distinct_cards {
                card(rng)
            } else {
                GOOD_CARD.into()
            },
        };
        (order, rng.gen_bool(self.cancel_share.clamp(0.0, 1.0)))
    }
}

/// The name of SKU `s` of `n` (`WIDGET` alone when there is one).
fn sku(s: usize, n: usize) -> String {
    if n <= 1 {
        "WIDGET".into()
    } else {
        format!("SKU-{s:04}")
    }
}

/// A random 16-digit card number with a valid Luhn check digit, never the
/// mock gateway's declined card.
pub fn card(rng: &mut impl Rng) -> String {
    loop {
        let mut digits: Vec<u32> = std::iter::once(4)
            .chain((0..14).map(|_| rng.gen_range(0..10)))
            .collect();
        digits.push(luhn_check_digit(&digits));
        let card: String = digits.iter().map(|d| char::from_digit(*d, 10).unwrap_or('0')).collect();
        if card != crate::driver::DECLINED_CARD {
            return card;
        }
    }
}

/// The digit that makes `payload` + it pass the Luhn check.
fn luhn_check_digit(payload: &[u32]) -> u32 {
    let sum: u32 = payload
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 0 {
                (d * 2) % 9 + u32::from(*d == 9) * 9
            } else {
                *d
            }
        })
        .sum();
    (10 - sum % 10) % 10
}

#[cfg(test)]
mod tests {
    use super::*;

    fn luhn_valid(card: &str) -> bool {
        let sum: u32 = card
            .chars()
            .rev()
            .filter_map(|c| c.to_digit(10))
            .enumerate()
            .map(|(i, d)| {
                if i % 2 == 1 {
                    if d * 2 > 9 {
                        d * 2 - 9
                    } else {
                        d * 2
                    }
                } else {
                    d
                }
            })
            .sum();
        sum.is_multiple_of(10)
    }

    #[test]
    fn cards_are_luhn_valid_sixteen_digits_and_distinct() {
        assert!(luhn_valid(GOOD_CARD));
        assert!(!luhn_valid("4242424242424241"));
        let mut rng = rand::thread_rng();
        let cards: std::collections::BTreeSet<String> = (0..1_000).map(|_| card(&mut rng)).collect();
        assert_eq!(cards.len(), 1_000);
        for c in &cards {
            assert_eq!(c.len(), 16);
            assert!(luhn_valid(c), "{c}");
        }
    }

    #[test]
    fn the_realistic_mix_cancels_about_a_tenth_of_many_skus_each_with_its_own_card() {
        let mut rng = rand::thread_rng();
        let draws: Vec<(OrderRequest, bool)> = (0..10_000).map(|_| Mix::realistic().draw(&mut rng)).collect();
        let cancels = draws.iter().filter(|(_, c)| *c).count();
        let skus: std::collections::BTreeSet<&str> = draws.iter().map(|(o, _)| o.sku.as_str()).collect();
        let cards: std::collections::BTreeSet<&str> = draws.iter().map(|(o, _)| o.card.as_str()).collect();
        assert!((800..1_200).contains(&cancels), "{cancels}");
        assert!(skus.len() > 900, "{}", skus.len());
        assert_eq!(cards.len(), 10_000);
        let single: Vec<(OrderRequest, bool)> = (0..100).map(|_| Mix::single().draw(&mut rng)).collect();
        assert!(single
            .iter()
            .all(|(o, c)| !c && o.sku == "WIDGET" && o.card == GOOD_CARD));
        assert!(Mix::parse("nope").is_err());
    }
}
