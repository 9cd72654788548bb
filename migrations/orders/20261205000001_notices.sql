-- Order-confirmation notices, sent to a provider that takes no idempotency
-- key. The intent row is written in the transaction that confirms the order
-- (PENDING); a worker sends it and marks it SENT. Which of the two comes
-- first is the delivery choice (NOTICE_DELIVERY): send then mark is
-- at-least-once, mark then send is at-most-once.
CREATE TABLE notices (
    order_id   uuid        PRIMARY KEY REFERENCES orders (id),
    status     text        NOT NULL CHECK (status IN ('PENDING', 'SENT')),
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz
);
CREATE INDEX notices_pending ON notices (created_at) WHERE status = 'PENDING';
