-- The replies a consumer's effect emitted for an event, kept with its inbox
-- row (and deleted with it): a repeated event is answered again with them,
-- under their first event ids, instead of silence.
CREATE TABLE inbox_replies (
    consumer    text    NOT NULL,
    event_id    uuid    NOT NULL,
    seq         integer NOT NULL,
    reply_id    uuid    NOT NULL,
    topic       text    NOT NULL,
    message_key text    NOT NULL,
    event_type  text    NOT NULL,
    body        text    NOT NULL,
    traceparent text,
    PRIMARY KEY (consumer, event_id, seq),
    FOREIGN KEY (consumer, event_id) REFERENCES inbox (consumer, event_id) ON DELETE CASCADE
);
