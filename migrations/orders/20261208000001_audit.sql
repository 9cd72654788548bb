-- The audit trail (docs/operations.md, "The audit trail"): who did what,
-- when, from where — a failed authentication, a refusal, an API key created
-- or revoked. Written by order-api beside the act (a key's row in the same
-- statement as the key), read by people, purged after AUDIT_RETENTION_DAYS.
CREATE TABLE audit_log (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,  -- a client id, "operator", or "unknown"
    action  text        NOT NULL,  -- auth.failed, refused, api_key.created, api_key.revoked
    subject text,                  -- a key's id, a key's digest prefix, a refusal's reason
    source  text,                  -- the remote address, or "cli"
    detail  text
);
CREATE INDEX audit_log_at ON audit_log (at);

-- An API key may expire: past expires_at it opens nothing (as if revoked).
ALTER TABLE api_keys ADD COLUMN expires_at timestamptz;
