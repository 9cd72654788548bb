-- Completed idempotent requests. A row exists only once its request has
-- committed: it is inserted in the same transaction as the request's effect.
-- Requests in flight are marked by a transaction-scoped advisory lock instead,
-- so a crash before commit leaves nothing behind.
CREATE TABLE idempotency_keys (
    scope        text        NOT NULL,   -- the client (X-Client-Id)
    key          text        NOT NULL,
    fingerprint  text        NOT NULL,   -- sha256 of method, path, canonical body
    status_code  smallint    NOT NULL,
    headers      jsonb       NOT NULL,
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- The reaper deletes by expiry.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
