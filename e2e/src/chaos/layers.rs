//! One layer of deduplication switched off per run: the proof that the
//! suite would notice that layer missing. Each switch is an environment
//! variable the services honour only in builds with failpoints
//! (`service_kit::unsafe_switch`); with it on, a chaos run must fail and
//! name the invariant that broke.

use serde::Serialize;

use crate::invariants::{CHARGED_ONCE, ORDER_PER_KEY, STEP_ONCE};
use crate::stack::Service;

/// A layer switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
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
    /// Layer 4: the gateway ignores `Idempotency-Key` (a retried charge charges again).
    GatewayKey,
}

impl LayerOff {
    /// Every switch.
    pub const ALL: [LayerOff; 6] = [
        LayerOff::HttpKey,
        LayerOff::EventIdAtPublish,
        LayerOff::OrderSagaInbox,
        LayerOff::InventoryInbox,
        LayerOff::PaymentInbox,
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
            LayerOff::GatewayKey => (Service::Gateway, "UNSAFE_NO_IDEMPOTENCY_KEY"),
        }
    }

    /// The invariant a run with this layer off must break, and why.
    pub fn expected(self) -> (&'static str, &'static str) {
        match self {
            LayerOff::HttpKey => (ORDER_PER_KEY, "a client's retry with its key creates a second order"),
            LayerOff::EventIdAtPublish => (
                STEP_ONCE,
                "rows republished after a relay crash carry new ids: inboxes apply them, business keys catch them",
            ),
            LayerOff::OrderSagaInbox | LayerOff::InventoryInbox | LayerOff::PaymentInbox => (
                STEP_ONCE,
                "redelivered and injected duplicates reach the effect; only the business key stops them",
            ),
            LayerOff::GatewayKey => (
                CHARGED_ONCE,
                "payment-service's retry after a crash or a timeout charges again",
            ),
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
            LayerOff::GatewayKey => "gateway-key",
        }
    }
}
