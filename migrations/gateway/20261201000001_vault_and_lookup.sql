-- The card vault: one token per card, never the number. The fingerprint is
-- an HMAC of the number under the gateway's vault key (a plain hash of a
-- 16-digit number is reversible by trying them all); it finds a card's
-- existing token. last4 is what a merchant may show; `declines` is the mock
-- issuer's decision for this card, taken when it was tokenised.
CREATE TABLE card_tokens (
    token       text        PRIMARY KEY,
    fingerprint text        NOT NULL UNIQUE,
    last4       text        NOT NULL,
    declines    boolean     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Reconciliation asks "what did you do under this key?" (GET /v1/operations/{key}).
CREATE INDEX ledger_client_key ON ledger (client_id, idempotency_key);
