-- Redeliveries the inbox absorbed, per consumer and event: the durable
-- count behind "duplicates absorbed" (process metrics die with a SIGKILL).
CREATE TABLE inbox_redeliveries (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    redeliveries integer     NOT NULL,
    last_seen    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX inbox_redeliveries_last_seen ON inbox_redeliveries (last_seen);
