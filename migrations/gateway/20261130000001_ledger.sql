-- The gateway's ledger: every money movement it ever made. This table, not
-- the payment-service's own records, answers "was anyone charged twice?".
CREATE TABLE ledger (
    id              uuid        PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    order_id        uuid        NOT NULL,
    amount_cents    bigint      NOT NULL,
    status          text        NOT NULL CHECK (status IN ('captured', 'declined', 'refunded')),
    client_id       text        NOT NULL,
    idempotency_key text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_order ON ledger (order_id);
