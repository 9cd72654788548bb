//! The topics of the saga and the consumers that read them.
//!
//! Every message is keyed by its order id, so one order's messages stay in
//! one partition and therefore in order. A consumer's name is both its
//! Kafka consumer group and the name under which its inbox records the
//! events it applied: several consumers of one topic deduplicate each on
//! their own.

/// Commands for inventory-service (`ReserveStock`, `ReleaseStock`).
pub const INVENTORY_COMMANDS: &str = "inventory.commands";
/// Commands for payment-service (`ChargePayment`, `RefundPayment`).
pub const PAYMENT_COMMANDS: &str = "payment.commands";
/// Replies of the participants, consumed by the order saga in order-api.
pub const ORDER_EVENTS: &str = "order.events";
/// Every topic the saga uses.
pub const ALL: [&str; 3] = [INVENTORY_COMMANDS, PAYMENT_COMMANDS, ORDER_EVENTS];

/// The consumers of the saga: who reads which topic.
pub mod consumers {
    /// A consumer of the saga.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Consumer {
        /// Its Kafka consumer group, and the name its inbox records events under.
        pub name: &'static str,
        /// The topic it reads.
        pub topic: &'static str,
    }

    /// The order saga in order-api.
    pub const ORDER_SAGA: Consumer = Consumer {
        name: "order-saga",
        topic: super::ORDER_EVENTS,
    };
    /// inventory-service.
    pub const INVENTORY: Consumer = Consumer {
        name: "inventory-service",
        topic: super::INVENTORY_COMMANDS,
    };
    /// payment-service.
    pub const PAYMENT: Consumer = Consumer {
        name: "payment-service",
        topic: super::PAYMENT_COMMANDS,
    };
    /// Every consumer of the saga.
    pub const ALL: [Consumer; 3] = [ORDER_SAGA, INVENTORY, PAYMENT];
}
