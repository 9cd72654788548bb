-- Which vault key each card's fingerprint was made under (a short,
-- non-reversible id of the key, vault::key_id): the operator retires
-- GATEWAY_VAULT_KEY_PREVIOUS once no card is left under it
-- (vault_cards{key="previous"} is 0). Rows from before are NULL: unknown.
ALTER TABLE card_tokens ADD COLUMN key_id text;
CREATE INDEX card_tokens_key_id ON card_tokens (key_id);
