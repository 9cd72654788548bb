-- The relay publishes an envelope exactly as its service serialised it, and
-- its claim parses nothing: `json` keeps the text as written (jsonb would
-- re-render it, and the relay would pay for rendering it on every claim),
-- and the two header fields the relay needs besides event_id are columns.
ALTER TABLE outbox
    ALTER COLUMN envelope TYPE json USING envelope::json,
    ADD COLUMN event_type text,
    ADD COLUMN traceparent text;
UPDATE outbox SET event_type = envelope->>'event_type', traceparent = envelope->>'traceparent';
ALTER TABLE outbox ALTER COLUMN event_type SET NOT NULL;
