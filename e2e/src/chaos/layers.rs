//! One layer of deduplication switched off per run: the proof that the
//! suite would notice that layer missing. Each switch is an environment
//! variable the services honour only in builds with failpoints
//! (`crates/switches`, one `switches::Switch` each); with it on, a chaos
//! run must fail — and fail on the **effect** the layer guards (a second
//! order for a key, a step applied again, a second capture, a message lost
//! or stuck), read from the databases and the ledger, never from a counter
//! the switched-off layer itself keeps.

use serde::Serialize;

use crate::invariants::{Audit, CHARGED_ONCE, NOTHING_LOST, NOTHING_STUCK, ORDER_PER_KEY, STEP_ONCE};
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
    /// Layer 3 done wrong: inventory commits its inbox rows in their own
    /// transaction, before the effect (the suite's in-transaction crash
    /// then loses the effect).
    InboxSeparateTx,
    /// At-least-once done wrong: inventory's consumer commits each batch's
    /// offsets before handling it (the suite's in-transaction crash then
    /// loses the batch).
    OffsetBeforeHandling,
    /// Layer 4: the gateway ignores `Idempotency-Key` (a retried charge charges again).
    GatewayKey,
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
    pub const ALL: [LayerOff; 8] = [
        LayerOff::HttpKey,
        LayerOff::EventIdAtPublish,
        LayerOff::OrderSagaInbox,
        LayerOff::InventoryInbox,
        LayerOff::PaymentInbox,
        LayerOff::InboxSeparateTx,
        LayerOff::OffsetBeforeHandling,
        LayerOff::GatewayKey,
    ];

    /// The service and variable that switch it off.
    pub fn env(self) -> (Service, &'static str) {
        match self {
            LayerOff::HttpKey => (Service::OrderApi, "UNSAFE_NO_IDEMPOTENCY_KEY"),
            LayerOff::EventIdAtPublish => (Service::Relay, "UNSAFE_EVENT_ID_AT_PUBLISH"),
            LayerOff::OrderSagaInbox => (Service::OrderApi, "UNSAFE_NO_INBOX"),
            LayerOff::InventoryInbox => (Service::Inventory, "UNSAFE_NO_INBOX"),
            LayerOff::PaymentInbox => (Service::Payment, "UNSAFE_NO_INBOX"),
            LayerOff::InboxSeparateTx => (Service::Inventory, "UNSAFE_INBOX_SEPARATE_TX"),
            LayerOff::OffsetBeforeHandling => (Service::Inventory, "UNSAFE_OFFSET_BEFORE_HANDLING"),
            LayerOff::GatewayKey => (Service::Gateway, "UNSAFE_NO_IDEMPOTENCY_KEY"),
        }
    }

    /// The consumer whose repeated effect shows an inbox layer missing, and
    /// the business keys that catch the repeat there (`inbox_misses.caught_by`).
    fn repeated_effect(self) -> Option<(&'static str, &'static [&'static str])> {
        use contract::topics::consumers::{INVENTORY, PAYMENT};
        match self {
            LayerOff::InventoryInbox => Some((
                INVENTORY.name,
                &["reservation per order", "release once per reservation"],
            )),
            LayerOff::PaymentInbox => Some((PAYMENT.name, &["payment per operation"])),
            _ => None,
        }
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
                NOTHING_STUCK,
                "an order whose reservation never happened: stuck, or moved only by the reconciler",
                "a crash with the effect's transaction open, after the inbox rows committed on their own, leaves \
                 the event recorded as processed: its redelivery (and every re-send) is absorbed and the effect \
                 is never applied",
            ),
            LayerOff::OffsetBeforeHandling => (
                NOTHING_LOST,
                "an order finished only by a later copy of its lost message (a re-send, a republish, an \
                 injected copy: the inbox names the copy applied), or stuck",
                "a crash with the handler's transaction open, after the offset was committed, loses the batch: \
                 the broker never redelivers it, and only a later copy (or nothing) moves the order",
            ),
            LayerOff::GatewayKey => (
                CHARGED_ONCE,
                "an order captured twice in the gateway's ledger",
                "payment-service's retry after a crash or a timeout charges again",
            ),
        };
        Expectation { invariant, effect, why }
    }

    /// Whether `audit` shows the effect this layer guards: read from the
    /// databases and the ledger, consumer by consumer — never from the
    /// count of duplicates an inbox absorbed (a switched-off inbox counts
    /// none, so a counter would "catch" it with no effect repeated).
    pub fn caught_in(self, audit: &Audit) -> bool {
        if let Some((consumer, effects)) = self.repeated_effect() {
            return audit
                .inbox_misses
                .get(consumer)
                .is_some_and(|by| effects.iter().any(|e| by.get(*e).is_some_and(|n| *n > 0)));
        }
        match self {
            LayerOff::HttpKey => audit.requests_with_two_orders > 0,
            LayerOff::EventIdAtPublish => {
                audit.replies_applied_twice > 0
                    || audit.events_answered_twice > 0
                    || audit.inbox_misses.values().flat_map(|by| by.values()).any(|n| *n > 0)
            }
            LayerOff::OrderSagaInbox => audit.replies_applied_twice > 0 || audit.events_answered_twice > 0,
            LayerOff::InboxSeparateTx | LayerOff::OffsetBeforeHandling => {
                !audit.stuck.is_empty() || !audit.rescued.is_empty() || !audit.lost.is_empty()
            }
            LayerOff::GatewayKey => !audit.double_charged.is_empty() || audit.ledger_keys_repeated > 0,
            LayerOff::InventoryInbox | LayerOff::PaymentInbox => unreachable!("handled above"),
        }
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
        }
    }
}
