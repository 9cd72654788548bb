-- One charge and at most one refund per order. The idempotency key is
-- derived from the operation (the order and the kind), never from the
-- message, so every delivery of every command for this operation asks the
-- gateway with the same key.
CREATE TABLE payments (
    order_id        uuid        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    idempotency_key text        NOT NULL UNIQUE,
    amount_cents    bigint      NOT NULL,
    status          text        NOT NULL CHECK (status IN ('PENDING', 'CAPTURED', 'DECLINED', 'REFUNDED')),
    gateway_ref     text,
    attempts        integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, kind)
);
