-- Publish attempts started, committed *before* the broker is asked, outside
-- the claiming transaction. A row whose attempt count exceeds one when its
-- round completes was published by a relay that crashed before marking it:
-- that is the relay_republished_after_crash_total metric.
CREATE TABLE outbox_attempts (
    id       bigint  PRIMARY KEY,
    started  integer NOT NULL
);
