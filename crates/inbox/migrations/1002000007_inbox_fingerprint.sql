-- What fact an inbox row's event id was recorded for: its type and a 64-bit
-- digest of its type, order and payload (contract::Envelope::fingerprint).
-- A repeat with the same id and another fingerprint is not a copy but a
-- reused id — another fact under a used identity — and is dead-lettered,
-- not absorbed. NULL: recorded without one (by hand, or before this column).
ALTER TABLE inbox ADD COLUMN event_type text, ADD COLUMN digest bigint;
