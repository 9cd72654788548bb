//! `cargo xtask scenario N`: one failure scenario of docs/scenarios.md, told
//! as a story — what is injected, which layer acts, which invariant is
//! checked — and then its test, run for real.

/// Where a scenario's test lives.
pub struct Test {
    /// Cargo package.
    pub package: &'static str,
    /// Integration-test target, or `None` for the library's unit tests.
    pub target: Option<&'static str>,
    /// Test name (substring filter, as cargo test takes it).
    pub name: &'static str,
}

/// One scenario.
pub struct Scenario {
    /// Its number in docs/design.md.
    pub n: u8,
    /// What can go wrong.
    pub title: &'static str,
    /// What the test does to make it happen.
    pub injected: &'static str,
    /// Which layer (or mechanism) absorbs it, and where in the code.
    pub acts: &'static str,
    /// What the test checks afterwards.
    pub checked: &'static str,
    /// The test.
    pub test: Test,
}

const fn t(package: &'static str, target: Option<&'static str>, name: &'static str) -> Test {
    Test { package, target, name }
}

/// The 21 scenarios of the seeds, then the paths added by deadlines,
/// reconciliation, tokenisation (22–25), replies kept with the inbox (26),
/// a provider without keys (27) and an event id used for two facts (28).
pub const ALL: [Scenario; 28] = [
    Scenario {
        n: 1,
        title: "the relay publishes, the ack is lost (it crashes before marking): the broker holds the event twice",
        injected: "a relay publishes a batch and dies before marking it published (crash between publish and mark)",
        acts: "layer 2 — the event id was fixed when the row was written (crates/outbox), so the republish carries the same id",
        checked: "the broker holds each event twice, both copies with the same event_id",
        test: t("effectively-once-outbox", Some("relay"), "crash_between_publish_and_mark_publishes_again_with_the_same_event_id"),
    },
    Scenario {
        n: 2,
        title: "the broker redelivers because an offset was not committed",
        injected: "inventory-service handles 20 orders with offset commits held back for an hour, then is SIGKILLed",
        acts: "layer 3 — the inbox (crates/inbox) turns every redelivered command into a counted no-op",
        checked: "all 20 redeliveries absorbed, stock taken once per order, then commits resume",
        test: t("e2e", Some("e2e"), "a_sigkill_with_many_handled_but_uncommitted_offsets_is_absorbed_by_the_inbox"),
    },
    Scenario {
        n: 3,
        title: "a consumer crashes after its database commit, before its offset commit",
        injected: "as in 2: every handled message is committed in PostgreSQL, none at the broker, then SIGKILL",
        acts: "layer 3 — offsets are stored only after the handler's transaction; the inbox absorbs what comes back",
        checked: "absorbed ≥ handled (it fails if offsets were committed eagerly: nothing would come back)",
        test: t("e2e", Some("e2e"), "a_sigkill_with_many_handled_but_uncommitted_offsets_is_absorbed_by_the_inbox"),
    },
    Scenario {
        n: 4,
        title: "two instances process the same message at once",
        injected: "ten concurrent handlers of one ReserveStock event",
        acts: "layer 3 — the inbox primary key (consumer, event_id) decides inside the transaction",
        checked: "exactly one Applied, stock taken once, one inbox row",
        test: t("inventory-service", Some("stock"), "two_instances_handling_one_event_at_once_apply_it_once"),
    },
    Scenario {
        n: 5,
        title: "several consumers of one event each deduplicate on their own",
        injected: "one event consumed by two consumer groups",
        acts: "layer 3 — the consumer name is part of the inbox key",
        checked: "each consumer applies it once",
        test: t("kafka", Some("consumer"), "same_event_twice_is_one_effect_equal_payloads_are_two"),
    },
    Scenario {
        n: 6,
        title: "the effect and the inbox record must commit together",
        injected: "the ordinary chaos schedule with the inbox rows committed apart from, and before, their effects (UNSAFE_INBOX_SEPARATE_TX): its crash of every consumer with the effect's transaction open (consumer::in_transaction) lands between the two",
        acts: "layer 3 — one transaction for inbox row, effect and reply (inbox::begin_batch, the effect, commit — in each handler); committed apart, the redelivery is absorbed with no effect behind it",
        checked: "the run fails as it must: the crashed batch's orders never get their reservation (stuck, or moved only by the deadline reconciler, which the audit counts); with one transaction the same suite passes",
        test: t(
            "e2e",
            Some("e2e"),
            "with_the_inbox_row_committed_before_the_effect_a_crash_between_them_loses_the_effect",
        ),
    },
    Scenario {
        n: 7,
        title: "an external side effect is made safe by the gateway's idempotency key",
        injected: "the same charge sent twice with one key, then with other parameters",
        acts: "layer 4 — the gateway's Idempotency-Key (crates/idempotency, services/mock-gateway)",
        checked: "the original charge is returned; other parameters under the key are refused",
        test: t("mock-gateway", Some("gateway"), "same_key_returns_the_original_and_other_parameters_are_refused"),
    },
    Scenario {
        n: 8,
        title: "payment-service crashes after the gateway charged, before recording it",
        injected: "crash point payment::after_gateway_before_record aborts payment-service",
        acts: "layer 4 — the payment stays PENDING, the redelivery asks the gateway again with the same key",
        checked: "one capture in the gateway's ledger, the order CONFIRMED",
        test: t("e2e", Some("e2e"), "payment_service_killed_after_the_charge_before_recording_it_charges_once"),
    },
    Scenario {
        n: 9,
        title: "handlers guarded by state preconditions are naturally idempotent",
        injected: "every reply applied twice and out of order to the state machine",
        acts: "the saga's state machine (services/order-api/src/saga/transitions.rs)",
        checked: "no reply applies twice or moves an order backwards",
        test: t("order-api", None, "replies_are_never_applied_twice_or_backwards"),
    },
    Scenario {
        n: 10,
        title: "a client retries POST /orders after a timeout",
        injected: "twenty concurrent requests with one Idempotency-Key",
        acts: "layer 1 — crates/idempotency: one request runs, the others get 409 or its stored response",
        checked: "one order",
        test: t("order-api", Some("http"), "twenty_concurrent_requests_with_one_key_create_one_order"),
    },
    Scenario {
        n: 11,
        title: "two different events with equal payloads are both applied",
        injected: "two ReserveStock events with equal payloads, and one event twice",
        acts: "identity is the event id, never the payload",
        checked: "two effects for two events, one for the repeated one",
        test: t("inventory-service", Some("stock"), "the_same_event_twice_is_one_effect_and_two_equal_events_are_two"),
    },
    Scenario {
        n: 12,
        title: "deduplication records must outlive the redelivery window",
        injected: "inbox rows inside and past the retention window, then a redelivery",
        acts: "inbox retention (crates/inbox): purges only past the window",
        checked: "a redelivery inside the window is absorbed; past it the row is gone",
        test: t("effectively-once-inbox", Some("retention"), "inbox_retention_keeps_rows_inside_the_window"),
    },
    Scenario {
        n: 13,
        title: "recording 'processed' before an external call would lose the call",
        injected: "crash point between the gateway call and recording its result",
        acts: "the payment status model: PENDING until the result is recorded with the inbox row",
        checked: "charged once, recorded once",
        test: t("e2e", Some("e2e"), "payment_service_killed_after_the_charge_before_recording_it_charges_once"),
    },
    Scenario {
        n: 14,
        title: "several relays at once: no double claim, no reordering",
        injected: "three pipelined relays with batches in flight on one outbox",
        acts: "layer 2 — FOR UPDATE SKIP LOCKED plus the head-of-key rule (crates/outbox/src/relay.rs)",
        checked: "every row published once per relay claim, each order's events in order",
        test: t("effectively-once-outbox", Some("relay"), "three_pipelined_relays_keep_each_orders_order"),
    },
    Scenario {
        n: 15,
        title: "acknowledging before processing loses messages",
        injected: "inventory dies 3 s into handling a command (crash point consumer::while_handling), offsets committed every 100 ms",
        acts: "the consumer stores an offset only after the handler's transaction (crates/kafka/src/consumer.rs)",
        checked: "after the restart the command is handled and the order CONFIRMED without the deadline reconciler (with the offset committed first, the reconciler re-sends it at 15 s and the history fails the test)",
        test: t("e2e", Some("e2e"), "scenario_15_a_consumer_that_dies_mid_handling_gets_the_message_again"),
    },
    Scenario {
        n: 16,
        title: "a new id per producer retry would defeat deduplication",
        injected: "a relay crash between publish and mark, then a second relay",
        acts: "layer 2 — the id is fixed at insert (contract::Envelope::new, saga_kit::emit::emit)",
        checked: "the republished copy has the original event id",
        test: t("effectively-once-outbox", Some("relay"), "crash_between_publish_and_mark_publishes_again_with_the_same_event_id"),
    },
    Scenario {
        n: 17,
        title: "poison messages go to a dead-letter topic and the partition moves on",
        injected: "an undecodable body and an unknown event type in front of a good message",
        acts: "the consumer's dead-letter path (crates/kafka/src/consumer.rs, dlq.rs)",
        checked: "both in the dead-letter topic with the reason; the good message applied",
        test: t("kafka", Some("consumer"), "poison_goes_to_the_dead_letter_topic_and_the_partition_moves_on"),
    },
    Scenario {
        n: 18,
        title: "the idempotent producer removes broker-side duplicates, not duplicate effects",
        injected: "on Apache Kafka: the broker appends a relay's batch, a fault proxy (advertised as the broker) swallows the produce response and drops the connection, the producer retries the batch; then the same with UNSAFE_NO_PRODUCER_IDEMPOTENCE",
        acts: "the idempotent producer: the retry carries the same producer id and sequence numbers, and the broker keeps one copy; a relay crash after the ack (scenario 1) is a new request the broker cannot recognise, which the inbox absorbs",
        checked: "with idempotence every event is once in the log; without it the retried batch is in the log twice (the negative control fails the first check)",
        test: t("effectively-once-outbox", Some("relay"), "lost_ack::"),
    },
    Scenario {
        n: 19,
        title: "a redelivered reservation does not take stock twice",
        injected: "a second ReserveStock for the same order under a new event id",
        acts: "the reservation's primary key (order id)",
        checked: "stock taken once",
        test: t("inventory-service", Some("stock"), "a_second_reserve_for_the_same_order_under_a_new_event_id_is_a_no_op"),
    },
    Scenario {
        n: 20,
        title: "a redelivered payment reply does not confirm (credit) twice",
        injected: "PaymentCaptured delivered twice, then republished under a new event id",
        acts: "layer 3 — the saga's inbox; behind it the state machine, which records the repeat as an inbox miss",
        checked: "one CONFIRMED step, the redelivery Duplicate, the republished copy ignored and counted",
        test: t("order-api", Some("saga"), "scenario_20_a_redelivered_payment_reply_confirms_the_order_once"),
    },
    Scenario {
        n: 21,
        title: "the contract: the same event twice is one effect, equal payloads are two",
        injected: "one event sent twice and an equal-payload event once",
        acts: "layer 3 — the inbox keyed by event id",
        checked: "two effects",
        test: t("kafka", Some("consumer"), "same_event_twice_is_one_effect_equal_payloads_are_two"),
    },
    Scenario {
        n: 22,
        title: "a command is dead-lettered and its saga would wait forever",
        injected: "payment-service dead-letters the first ChargePayment (fault point payment::dead_letter_command)",
        acts: "deadlines — past SAGA_DEADLINE_AWAITING_PAYMENT_SECS order-api finds no charge at the gateway and re-sends the command under its first event id (services/order-api/src/saga/reconcile.rs)",
        checked: "the order is CONFIRMED, one capture in the ledger, no inbox miss",
        test: t("e2e", Some("e2e"), "a_dead_lettered_charge_is_resent_at_its_deadline_and_the_order_ends_charged_once"),
    },
    Scenario {
        n: 23,
        title: "the gateway charged, and payment-service stays down past the deadline",
        injected: "payment-service aborts after the charge, before recording it, and is not restarted until the order is confirmed",
        acts: "reconciliation — order-api asks the gateway by the operation's key (GET /v1/operations/{key}) and confirms from its record; the late reply is set aside",
        checked: "CONFIRMED while payment-service is down; after its restart one capture, the payment CAPTURED, no inbox miss",
        test: t("e2e", Some("e2e"), "the_gateway_charged_and_payment_service_stayed_down_the_order_is_reconciled_charged_once"),
    },
    Scenario {
        n: 24,
        title: "the gateway refuses a refund: the order would stay REFUNDING",
        injected: "the gateway's refuse_refunds fault during a cancel",
        acts: "RefundFailed → MANUAL_REVIEW; the operator's `order-api review retry-refund` makes a new attempt under a new key",
        checked: "MANUAL_REVIEW, then CANCELLED with one refund and the stock released",
        test: t("e2e", Some("e2e"), "a_refused_refund_goes_to_manual_review_and_the_operators_retry_ends_it"),
    },
    Scenario {
        n: 25,
        title: "card numbers kept in databases and on topics",
        injected: "a run with good, declined and refunded orders, plus orders written before tokenisation (one with a value the vault refuses); then a brute force over every number that fits each card's BIN and last four",
        acts: "the gateway's vault (POST /v1/tokens) — orders keep a token and the last four digits; ChargePayment carries the token; a start-up backfill tokenises old rows and parks the refused one; Idempotency-Key fingerprints are keyed (HMAC under a deployment secret)",
        checked: "no table of any database and no message of any topic holds a test card number, and no stored hash or fingerprint gives one up to the brute force",
        test: t("e2e", Some("e2e"), "no_database_or_topic_holds_a_card_number_after_a_run"),
    },
    Scenario {
        n: 26,
        title: "a reply is lost after it was sent: the command's re-send would be absorbed in silence",
        injected: "a command handled and its reply published, then the same command again under its first event id (the saga's deadline re-send after the reply was dead-lettered)",
        acts: "the inbox keeps the replies an effect emitted with the event's row (inbox_replies, purged with it); a repeated event is answered again with them, enqueued under their first ids (saga_kit::consumer::begin)",
        checked: "the same reply (same event id) pending again in the outbox, no second reply, the stock reserved once",
        test: t("inventory-service", Some("stock"), "a_repeated_command_is_answered_again_with_its_first_reply"),
    },
    Scenario {
        n: 27,
        title: "a provider without idempotency keys: the process dies between sending a notice and marking it sent",
        injected: "order-api aborts after the confirmation notice reached the notifier and before its row is marked SENT",
        acts: "no layer can: the notifier takes no key and cannot be asked; the intent row (written with the CONFIRMED transition) and the delivery choice decide — at-least-once (NOTICE_DELIVERY, the default) sends again",
        checked: "the notifier received two notices for the order (one more for the one crash), none lost; an order without a crash gets one",
        test: t("e2e", Some("e2e"), "at_least_once_a_crash_between_send_and_mark_sends_the_notice_twice"),
    },
    Scenario {
        n: 28,
        title: "an event id used again for another fact would be absorbed as a copy",
        injected: "an event recorded, then the same id with another body, another type, and twice in one batch",
        acts: "the inbox keeps each id's type and digest (contract::Envelope::fingerprint); a repeat with another is Recorded::Reused — refused and dead-lettered by the consumers (saga_kit::consumer::begin), counted in inbox_reused_ids_total",
        checked: "copies are duplicates, the reuses are refused and not counted as redeliveries",
        test: t("effectively-once-inbox", Some("retention"), "an_id_used_again_for_another_fact_is_refused_not_absorbed"),
    },
];

/// The scenario numbered `n`.
pub fn get(n: u8) -> Option<&'static Scenario> {
    ALL.iter().find(|s| s.n == n)
}
