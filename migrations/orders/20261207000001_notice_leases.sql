-- The notice worker no longer holds a transaction across the provider's
-- calls: it leases a batch of pending notices (leased_until), commits, sends
-- them concurrently, then marks them SENT. A worker that dies mid-round
-- leaves its lease to expire; another worker (or its restart) then sends
-- those notices again — at-least-once, as before, without a transaction or
-- a lock held for the length of the calls.
ALTER TABLE notices ADD COLUMN leased_until timestamptz;
