-- The replies leave with their inbox rows by the purge's own statement
-- (inbox::purge deletes both in one), not by a foreign key's cascade: a
-- cascade deletes each inbox row's replies by a statement of its own, and
-- every reply written checked and share-locked its inbox row (an index
-- lookup and a WAL record per reply). Both are written in the one
-- transaction that records the event (saga_kit::emit::reply_all).
ALTER TABLE inbox_replies DROP CONSTRAINT inbox_replies_consumer_event_id_fkey;
