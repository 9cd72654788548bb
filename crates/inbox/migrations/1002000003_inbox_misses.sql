-- Events the inbox let through as new whose effect had already been applied:
-- a business key (a reservation per order, a payment per operation, the
-- saga's state machine) caught the repeat instead. A healthy system writes
-- none: every redelivery carries its event id and stops at the inbox. The
-- chaos suite's "each saga step applied once" invariant counts these rows;
-- with the inbox switched off, or event ids minted at publish, they appear.
CREATE TABLE inbox_misses (
    consumer  text        NOT NULL,
    event_id  uuid        NOT NULL,
    order_id  uuid        NOT NULL,
    caught_by text        NOT NULL,
    seen_at   timestamptz NOT NULL DEFAULT now()
);
