-- The relay no longer waits on LISTEN/NOTIFY: it probes for pending rows
-- every few milliseconds when idle. Every notifying commit took PostgreSQL's
-- notification-queue lock and signalled the listeners, which under load cost
-- more database CPU per order than the saga's own transactions.
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
DROP FUNCTION IF EXISTS outbox_notify();
