-- Card data: orders keep the gateway's token and the last four digits,
-- never the number. `card` stays only until order-api's start-up backfill
-- has tokenised the rows written before this migration (it sets it to NULL);
-- a later migration drops it once no row holds one.
ALTER TABLE orders
    ALTER COLUMN card DROP NOT NULL,
    ADD COLUMN card_token text,
    ADD COLUMN card_last4 text;

-- Deadlines and reconciliation: the command the order's current state is
-- waiting on (re-sent under the same event id when the state is overdue, so
-- an inbox that has it absorbs it), how many times it was re-sent, which
-- refund attempt is current (an operator's retry after a failed refund is a
-- new gateway operation), and when the gateway's answer was taken without
-- the participant's reply.
ALTER TABLE orders
    ADD COLUMN last_command_id    uuid,
    ADD COLUMN reconcile_attempts integer     NOT NULL DEFAULT 0,
    ADD COLUMN refund_attempt     integer     NOT NULL DEFAULT 1,
    ADD COLUMN reconciled_at      timestamptz;

-- The reconciler's scan: open orders by age.
CREATE INDEX orders_open_by_update ON orders (updated_at)
    WHERE status IN ('PENDING', 'AWAITING_PAYMENT', 'REFUNDING', 'CANCELLING');

-- API keys: a client authenticates with `Authorization: Bearer <key>`; only
-- the key's SHA-256 is kept (keys are 160 random bits: a fast hash is
-- enough, and a lookup must be one index probe). Provisioned and revoked
-- with `order-api keys …`.
CREATE TABLE api_keys (
    id         uuid        PRIMARY KEY,
    client_id  text        NOT NULL,
    key_hash   text        NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
