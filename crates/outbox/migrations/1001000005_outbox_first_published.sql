-- When the relay first marked a row published. A deadline's re-send makes
-- the row pending again (published_at NULL) but keeps this: the audit
-- checks that the row's first copy in its topic's log was appended before
-- this time — a row marked published without reaching the log is a loss
-- before the log, whatever a later re-send hides.
ALTER TABLE outbox ADD COLUMN first_published_at timestamptz;
