//! One layer of deduplication switched off per run: the proof that the
//! suite would notice that layer missing. Each switch is an environment
//! variable the services honour only in builds with failpoints
//! (`crates/switches`, one `switches::Switch` each); with it on, a chaos
//! run must fail — and fail on the **effect** the layer guards (a second
//! order for a key, a step applied again, a second capture, a message lost
//! or stuck), read from the databases and the ledger, never from a counter
//! the switched-off layer itself keeps.

use serde::Serialize;

use crate::invariants::{Audit, CHARGED_ONCE, NOTHING_LOST, ORDER_PER_KEY, STEP_ONCE};
use crate::stack::Service;

/// A layer switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize, clap::ValueEnum)]
pub enum LayerOff {
    /// Layer 1: order-api ignores `Idempotency-Key` (a retry makes a new order).
    HttpKey,
    /// Layer 2: the relay gives each publish a new event id (a republished
    /// row is a new event to every inbox).
    EventIdAtPublish,
    /// Layer 3: the order saga's inbox.
    OrderSagaInbox,
    /// Layer 3: inventory's inbox.
    InventoryInbox,
    /// Layer 3: payment-service's inbox.
    PaymentInbox,
    /// Layer 3 done wrong: every consumer (the order saga, inventory,
    /// payment) commits its inbox rows in their own transaction, before the
    /// effect (the suite's in-transaction crash then loses the effect).
    InboxSeparateTx,
    /// At-least-once done wrong: every consumer commits each batch's
    /// offsets before handling it (the suite's in-transaction crash then
    /// loses the batch).
    OffsetBeforeHandling,
    /// Layer 4: the gateway ignores `Idempotency-Key` (a retried charge charges again).
    GatewayKey,
    /// Layer 2 done wrong: order-api commits a new order, then writes its
    /// command in a second transaction (the dual write the outbox forbids).
    OutboxAfterCommit,
    /// Layer 2 done wrong: the relay marks rows published that it never
    /// delivered (one row in twenty).
    RelayMarksUnsent,
}

/// What a run with a layer off must show.
#[derive(Debug, Clone, Copy)]
pub struct Expectation {
    /// The invariant that must break.
    pub invariant: &'static str,
    /// The effect that shows it, in words.
    pub effect: &'static str,
    /// Why the layer's absence leads there.
    pub why: &'static str,
}

impl LayerOff {
    /// Every switch.
    pub const ALL: [LayerOff; 10] = [
        LayerOff::HttpKey,
        LayerOff::EventIdAtPublish,
        LayerOff::OrderSagaInbox,
        LayerOff::InventoryInbox,
        LayerOff::PaymentInbox,
        LayerOff::InboxSeparateTx,
        LayerOff::OffsetBeforeHandling,
        LayerOff::GatewayKey,
        LayerOff::OutboxAfterCommit,
        LayerOff::RelayMarksUnsent,
    ];

    /// The services and the variable that switch it off.
    pub fn env(self) -> (Vec<Service>, &'static str) {
        const CONSUMERS: [Service; 3] = [Service::OrderApi, Service::Inventory, Service::Payment];
        let (service, var) = match self {
            LayerOff::InboxSeparateTx => return (CONSUMERS.to_vec(), "UNSAFE_INBOX_SEPARATE_TX"),
            LayerOff::OffsetBeforeHandling => return (CONSUMERS.to_vec(), "UNSAFE_OFFSET_BEFORE_HANDLING"),
            LayerOff::HttpKey => (Service::OrderApi, "UNSAFE_NO_IDEMPOTENCY_KEY"),
            LayerOff::EventIdAtPublish => (Service::Relay, "UNSAFE_EVENT_ID_AT_PUBLISH"),
            LayerOff::OrderSagaInbox => (Service::OrderApi, "UNSAFE_NO_INBOX"),
            LayerOff::InventoryInbox => (Service::Inventory, "UNSAFE_NO_INBOX"),
            LayerOff::PaymentInbox => (Service::Payment, "UNSAFE_NO_INBOX"),
            LayerOff::GatewayKey => (Service::Gateway, "UNSAFE_NO_IDEMPOTENCY_KEY"),
            LayerOff::OutboxAfterCommit => (Service::OrderApi, "UNSAFE_OUTBOX_AFTER_COMMIT"),
            LayerOff::RelayMarksUnsent => (Service::Relay, "UNSAFE_RELAY_MARKS_UNSENT"),
        };
        (vec![service], var)
    }

    /// The invariant a run with this layer off must break, the effect that
    /// shows it, and why.
    pub fn expected(self) -> Expectation {
        let (invariant, effect, why) = match self {
            LayerOff::HttpKey => (
                ORDER_PER_KEY,
                "a second order for one client request (the nonce each request carries in its amount)",
                "a client's retry with its key creates a second order",
            ),
            LayerOff::EventIdAtPublish => (
                STEP_ONCE,
                "a reply applied twice by the saga (order_history), an event answered twice in the log, or a step \
                 some consumer's business key caught (inbox_misses)",
                "rows republished after a relay crash carry new ids: inboxes apply them, business keys catch them",
            ),
            LayerOff::OrderSagaInbox => (
                STEP_ONCE,
                "a saga transition replayed: a reply reached the state machine again (order_history), or an event \
                 answered twice in the log",
                "redelivered and injected replies reach the saga; only its state machine stops them",
            ),
            LayerOff::InventoryInbox => (
                STEP_ONCE,
                "a second reservation movement: a command reached the reservation again",
                "redelivered and injected commands reach the stock; only the reservation per order stops them",
            ),
            LayerOff::PaymentInbox => (
                STEP_ONCE,
                "a second charge attempt: a command reached the payment again (its attempts counted twice)",
                "redelivered and injected commands reach the payment; only the payment per operation stops them",
            ),
            LayerOff::InboxSeparateTx => (
                NOTHING_LOST,
                "an event recorded in its consumer's inbox whose effect (a reservation movement, a payment \
                 operation, a saga transition) is absent",
                "a crash with the effect's transaction open, after the inbox rows committed on their own, leaves \
                 the event recorded as processed: its redelivery (and every re-send) is absorbed and the effect \
                 is never applied",
            ),
            LayerOff::OffsetBeforeHandling => (
                NOTHING_LOST,
                "an event in the log past its group's committed offset that no inbox holds, or one applied only \
                 from a later copy (a re-send, a republish, an injected copy: the inbox names the copy applied)",
                "a crash with the handler's transaction open, after the offset was committed, loses the batch: \
                 the broker never redelivers it, and only a later copy (or nothing) moves the order",
            ),
            LayerOff::GatewayKey => (
                CHARGED_ONCE,
                "an order captured twice in the gateway's ledger",
                "payment-service's retry after a crash or a timeout charges again",
            ),
            LayerOff::OutboxAfterCommit => (
                NOTHING_LOST,
                "a command re-sent by the deadline reconciler that existed nowhere before (not in the log, not \
                 in the outbox): lost before the log",
                "the suite's crash after an order's commit, before its response, falls between the order's \
                 transaction and its command's: the command is never written, and only the re-send makes one",
            ),
            LayerOff::RelayMarksUnsent => (
                NOTHING_LOST,
                "an outbox row marked published whose first copy the broker appended after the mark, or never",
                "the rows marked unsent reach no consumer: their orders wait for the deadline's re-send (a \
                 command again, or the reply a repeated command gets back), whose copy is the first in the log",
            ),
        };
        Expectation { invariant, effect, why }
    }

    /// The checks of `audit` that show the effect this layer guards, by
    /// name: each read from the databases, the ledger and the broker's log,
    /// consumer by consumer — never from the count of duplicates an inbox
    /// absorbed (a switched-off inbox counts none, so a counter would
    /// "catch" it with no effect repeated). Empty: not caught.
    pub fn caught_by(self, audit: &Audit) -> Vec<&'static str> {
        use contract::topics::consumers::{INVENTORY, PAYMENT};
        let missed = |consumer: &str, keys: &[&str]| {
            audit
                .inbox_misses
                .get(consumer)
                .is_some_and(|by| keys.iter().any(|k| by.get(*k).is_some_and(|n| *n > 0)))
        };
        let any_miss = audit.inbox_misses.values().flat_map(|by| by.values()).any(|n| *n > 0);
        let checks: &[(&'static str, bool)] = match self {
            LayerOff::HttpKey => &[("a client request made two orders", audit.requests_with_two_orders > 0)],
            LayerOff::EventIdAtPublish => &[
                ("a reply applied twice (order_history)", audit.replies_applied_twice > 0),
                ("an event answered twice in the log", audit.events_answered_twice > 0),
                ("a business key caught a repeat (inbox_misses)", any_miss),
            ],
            LayerOff::OrderSagaInbox => &[
                ("a reply applied twice (order_history)", audit.replies_applied_twice > 0),
                ("an event answered twice in the log", audit.events_answered_twice > 0),
                ("an effect without its inbox row", audit.effect_without_inbox > 0),
            ],
            LayerOff::InventoryInbox => &[
                (
                    "a reservation movement repeated (inbox_misses)",
                    missed(
                        INVENTORY.name,
                        &["reservation per order", "release once per reservation"],
                    ),
                ),
                ("an effect without its inbox row", audit.effect_without_inbox > 0),
            ],
            LayerOff::PaymentInbox => &[
                (
                    "a payment operation repeated (inbox_misses)",
                    missed(PAYMENT.name, &["payment per operation"]),
                ),
                ("an effect without its inbox row", audit.effect_without_inbox > 0),
            ],
            LayerOff::InboxSeparateTx => &[("an inbox row without its effect", audit.handled_without_effect > 0)],
            LayerOff::OffsetBeforeHandling => &[
                ("an event in the log no inbox holds", audit.never_handled > 0),
                ("an event applied from a later copy", audit.applied_from_later_copy > 0),
            ],
            LayerOff::GatewayKey => &[
                ("an order captured twice (ledger)", !audit.double_charged.is_empty()),
                ("a gateway key with two ledger entries", audit.ledger_keys_repeated > 0),
            ],
            LayerOff::OutboxAfterCommit | LayerOff::RelayMarksUnsent => {
                &[("a message lost before the log", audit.lost_before_the_log > 0)]
            }
        };
        checks.iter().filter(|(_, hit)| *hit).map(|(name, _)| *name).collect()
    }

    /// Whether `audit` shows the effect this layer guards ([`LayerOff::caught_by`]).
    pub fn caught_in(self, audit: &Audit) -> bool {
        !self.caught_by(audit).is_empty()
    }

    /// The words of the audit's line that states this layer's own effect
    /// where other lines of its invariant state consequences (the http key:
    /// a second order per request, not the keys without a stored answer).
    pub fn ground_truth(self) -> Option<&'static str> {
        match self {
            LayerOff::HttpKey => Some("client requests made more than one order"),
            _ => None,
        }
    }

    /// The share of the catch matrix one run of the test command takes:
    /// [`LayerOff::SHARE`] switches in a row of [`LayerOff::ALL`], starting
    /// where `seed` says, so that consecutive seeds go round every switch
    /// (the whole matrix is `cargo xtask chaos --matrix`).
    pub fn share(seed: u64) -> Vec<LayerOff> {
        let n = Self::ALL.len() as u64;
        let start = seed.wrapping_mul(Self::SHARE as u64) % n;
        (0..Self::SHARE as u64)
            .map(|i| Self::ALL[((start + i) % n) as usize])
            .collect()
    }

    /// How many switches one run of the test command takes.
    pub const SHARE: usize = 2;

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LayerOff::HttpKey => "http-key",
            LayerOff::EventIdAtPublish => "event-id-at-publish",
            LayerOff::OrderSagaInbox => "order-saga-inbox",
            LayerOff::InventoryInbox => "inventory-inbox",
            LayerOff::PaymentInbox => "payment-inbox",
            LayerOff::InboxSeparateTx => "inbox-separate-tx",
            LayerOff::OffsetBeforeHandling => "offset-before-handling",
            LayerOff::GatewayKey => "gateway-key",
            LayerOff::OutboxAfterCommit => "outbox-after-commit",
            LayerOff::RelayMarksUnsent => "relay-marks-unsent",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LayerOff;

    #[test]
    fn consecutive_seeds_go_round_every_switch() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 1_000..1_000 + LayerOff::ALL.len() as u64 {
            let share = LayerOff::share(seed);
            assert_eq!(share.len(), LayerOff::SHARE);
            let distinct: std::collections::BTreeSet<_> = share.iter().collect();
            assert_eq!(distinct.len(), LayerOff::SHARE, "{share:?}");
            seen.extend(share);
        }
        assert_eq!(seen.len(), LayerOff::ALL.len());
    }
}
