-- Transactional outbox. A row is written in the same transaction as the
-- state change it announces; the relay publishes it and sets published_at.
CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL UNIQUE,  -- assigned once, at insert
    topic        text        NOT NULL,
    message_key  text        NOT NULL,         -- the order id: Kafka key and ordering unit
    envelope     jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    parked_at    timestamptz                   -- rejected for good by the broker
);
-- The relay's scan and its "is there an earlier pending row of this order?" probe.
CREATE INDEX outbox_pending ON outbox (id) WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX outbox_pending_by_key ON outbox (message_key, id) WHERE published_at IS NULL;
-- Retention deletes published rows by age.
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Wake idle relays at commit time instead of making them poll hard.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_new', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
