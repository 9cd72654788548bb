-- A refund the gateway refused for good is FAILED (the order goes to manual
-- review); an operator's retry is a new attempt under a new key, which moves
-- the row back to PENDING.
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('PENDING', 'CAPTURED', 'DECLINED', 'REFUNDED', 'FAILED'));
ALTER TABLE payments ADD COLUMN attempt integer NOT NULL DEFAULT 1;
-- The reconciler's scan: operations still waiting for the gateway's answer.
CREATE INDEX payments_pending ON payments (updated_at) WHERE status = 'PENDING';
-- When the reconciler settled an overdue PENDING operation from the
-- gateway's record instead of a command's delivery.
ALTER TABLE payments ADD COLUMN reconciled_at timestamptz;
