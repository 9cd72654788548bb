//! What a repeat of a message gets: the same `event_id` again, after its
//! consumer handled the first copy — a redelivery, the relay publishing a
//! row twice, the saga re-sending a command at its deadline. Every
//! consumer's inbox recognises the copy; what happens then depends on the
//! message, and is part of the contract: a command is answered again with
//! the replies its first copy produced (the sender may have lost them), a
//! reply changes nothing. docs/contract.md ("What a repeat gets") and the
//! AsyncAPI document (`x-on-repeat`) say it per type; each consumer's tests
//! check its behaviour against [`ON_REPEAT`].

use crate::topics::consumers;

/// What the consumer of a message does with a copy it has handled before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRepeat {
    /// The replies the first copy produced, sent again under their first
    /// `event_id`s: no new effect, no new reply.
    StoredReplies,
    /// Nothing: no effect, no message; the copy is absorbed.
    Nothing,
}

impl OnRepeat {
    /// The sentence the document uses.
    pub fn says(self) -> &'static str {
        match self {
            OnRepeat::StoredReplies => "its first reply again, under the reply's first event_id; no second effect",
            OnRepeat::Nothing => "nothing: absorbed by the inbox, no transition, no message",
        }
    }
}

/// One message type's repeat: who consumes it, what a repeat gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeat {
    /// The message's `event_type`.
    pub event_type: &'static str,
    /// The consumer group that reads it.
    pub consumer: &'static str,
    /// What a repeat gets.
    pub on_repeat: OnRepeat,
}

const fn repeat(event_type: &'static str, consumer: &'static str, on_repeat: OnRepeat) -> Repeat {
    Repeat {
        event_type,
        consumer,
        on_repeat,
    }
}

/// Every message type, what a repeat of it gets.
pub const ON_REPEAT: &[Repeat] = &[
    repeat("ReserveStock", consumers::INVENTORY.name, OnRepeat::StoredReplies),
    repeat("ReleaseStock", consumers::INVENTORY.name, OnRepeat::StoredReplies),
    repeat("ChargePayment", consumers::PAYMENT.name, OnRepeat::StoredReplies),
    repeat("RefundPayment", consumers::PAYMENT.name, OnRepeat::StoredReplies),
    repeat("StockReserved", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
    repeat("StockRejected", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
    repeat("StockReleased", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
    repeat("PaymentCaptured", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
    repeat("PaymentDeclined", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
    repeat("PaymentRefunded", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
    repeat("RefundFailed", consumers::ORDER_SAGA.name, OnRepeat::Nothing),
];

/// What a repeat of `event_type` gets (None: no such type).
pub fn of(event_type: &str) -> Option<&'static Repeat> {
    ON_REPEAT.iter().find(|r| r.event_type == event_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message type is in the table once, with the consumer of its
    /// topic; and docs/contract.md's table says the same, row for row.
    #[test]
    fn every_type_has_its_repeat_and_the_document_says_the_same() {
        let types: Vec<String> = crate::schema::message_schemas().into_keys().collect();
        let listed: Vec<&str> = ON_REPEAT.iter().map(|r| r.event_type).collect();
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), listed.len(), "a type twice");
        assert_eq!(sorted, types.iter().map(String::as_str).collect::<Vec<_>>());
        for r in ON_REPEAT {
            let example = crate::schema::message_schemas()[r.event_type].clone();
            let message = crate::Message::from_parts(r.event_type, crate::schema::example_payload(&example)).unwrap();
            let consumer = consumers::ALL.iter().find(|c| c.topic == message.topic()).unwrap();
            assert_eq!(consumer.name, r.consumer, "{}", r.event_type);
        }
        let doc = include_str!("../../../docs/contract.md");
        let section = doc
            .split("## What a repeat gets")
            .nth(1)
            .expect("docs/contract.md has a section on repeats");
        let rows: Vec<Vec<&str>> = section
            .lines()
            .take_while(|l| !l.starts_with("## "))
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_matches('`'))
                    .collect()
            })
            .collect();
        let expected: Vec<Vec<&str>> = ON_REPEAT
            .iter()
            .map(|r| vec![r.event_type, r.consumer, r.on_repeat.says()])
            .collect();
        assert_eq!(rows, expected, "docs/contract.md's table of repeats");
    }
}
