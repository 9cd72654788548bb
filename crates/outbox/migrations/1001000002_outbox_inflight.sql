-- Batches a relay is publishing, committed *before* the broker is asked,
-- outside the claiming transaction, and deleted when the batch is marked.
-- A row left here by a crashed relay marks rows that were (maybe) published
-- but never marked: when another relay publishes them again, the overlap is
-- the relay_republished_after_crash_total metric. One row per batch keeps the
-- bookkeeping off the per-row hot path.
CREATE TABLE outbox_inflight (
    batch      uuid        PRIMARY KEY,
    ids        bigint[]    NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);
