-- The outbox holds pending rows only: a published row leaves the table in
-- the transaction that settles it. Kept, published rows made every claim
-- walk their dead index entries and autovacuum rewrite them; the update
-- that marked one copied its whole envelope. What the journey page and the
-- chaos audit need of a publication — when it first and last went out,
-- how often — is a narrow row of its own, without the envelope.
CREATE TABLE outbox_published (
    event_id           uuid        PRIMARY KEY,
    topic              text        NOT NULL,
    message_key        text        NOT NULL,
    event_type         text        NOT NULL,
    traceparent        text,
    created_at         timestamptz NOT NULL,
    -- The first relay that settled it; a re-send under the same event id
    -- (a deadline's) keeps it: the audit holds it against the log.
    first_published_at timestamptz NOT NULL,
    -- The latest settle.
    published_at       timestamptz NOT NULL,
    attempts           integer     NOT NULL
);
-- The journey page reads an order's publications by its key.
CREATE INDEX outbox_published_by_key ON outbox_published (message_key);
-- Retention deletes by time; rows arrive in time order, so a BRIN index
-- (a few pages for millions of rows) is enough and costs the hot path
-- almost nothing.
CREATE INDEX outbox_published_time ON outbox_published USING brin (published_at);

INSERT INTO outbox_published
    (event_id, topic, message_key, event_type, traceparent, created_at, first_published_at, published_at, attempts)
SELECT event_id, topic, message_key, event_type, traceparent, created_at,
       COALESCE(first_published_at, published_at), published_at, attempts
FROM outbox WHERE published_at IS NOT NULL;
DELETE FROM outbox WHERE published_at IS NOT NULL;

-- Without the published rows, a row's mark columns and their indexes go.
ALTER TABLE outbox DROP COLUMN published_at, DROP COLUMN first_published_at;
CREATE INDEX outbox_pending ON outbox (id) WHERE parked_at IS NULL;
CREATE INDEX outbox_pending_by_key ON outbox (message_key, id);

-- The in-flight note (a second connection and commit per batch, to count
-- rows republished after a relay's crash) leaves the hot path: a
-- republished copy is counted where it lands, by the consumers' inboxes
-- (consumer_duplicates_absorbed_total).
DROP TABLE outbox_inflight;
