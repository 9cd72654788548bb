-- Stock per SKU. The CHECK makes "never negative" a database fact, not a hope.
CREATE TABLE stock (
    sku        text        PRIMARY KEY,
    available  integer     NOT NULL CHECK (available >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One reservation per order: the primary key makes reserve idempotent per
-- order even when the command arrives again under a new event id.
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    sku        text        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity > 0),
    status     text        NOT NULL CHECK (status IN ('RESERVED', 'REJECTED', 'RELEASED')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
