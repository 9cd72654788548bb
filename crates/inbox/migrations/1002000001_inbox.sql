-- Inbox: one row per (consumer, event) that has been applied. The primary key
-- is the deduplication: a second insert of the same pair conflicts.
CREATE TABLE inbox (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
-- Retention deletes by age.
CREATE INDEX inbox_processed_at ON inbox (processed_at);
