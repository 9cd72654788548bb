-- The audit trail of the operator's stock changes (docs/operations.md,
-- "The audit trail"): who set which count, when, and what it was before —
-- written in the change's own statement.
CREATE TABLE audit_log (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,  -- the caller's name ("operator")
    action  text        NOT NULL,  -- stock.set
    subject text,                  -- the SKU
    source  text,
    detail  text                   -- "available 10 (was 7)"
);
CREATE INDEX audit_log_at ON audit_log (at);
