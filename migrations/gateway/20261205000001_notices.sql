-- The mock notifier: a provider that takes no idempotency key and simply
-- records every notice it receives. Two rows for one order are two notices
-- the customer got: the count per order is the ground truth of "sent twice"
-- or "never sent".
CREATE TABLE notices (
    id          bigserial   PRIMARY KEY,
    order_id    uuid        NOT NULL,
    client_id   text        NOT NULL,
    text        text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notices_order ON notices (order_id);
