-- Orders and their saga state. The status column is the saga's single source
-- of truth; order_history records every applied and ignored transition.
CREATE TABLE orders (
    id            uuid        PRIMARY KEY,
    client_id     text        NOT NULL,
    sku           text        NOT NULL,
    quantity      integer     NOT NULL CHECK (quantity > 0),
    amount_cents  bigint      NOT NULL CHECK (amount_cents > 0),
    card          text        NOT NULL,
    status        text        NOT NULL,
    cancel_reason text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_status ON orders (status);

CREATE TABLE order_history (
    id          bigserial   PRIMARY KEY,
    order_id    uuid        NOT NULL REFERENCES orders (id),
    from_status text,
    to_status   text        NOT NULL,
    cause       text        NOT NULL,   -- event type or HTTP action
    event_id    uuid,
    applied     boolean     NOT NULL,   -- false: an illegal/stale transition, ignored
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX order_history_order ON order_history (order_id, id);
