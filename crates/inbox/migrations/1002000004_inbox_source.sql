-- Where in the log the applied copy of an event was read (NULL: handed over
-- by hand, or recorded before this column existed). An event's copies share
-- its id; the row keeps the one that was applied. A correct consumer applies
-- the first copy it is delivered — in a partition, the lowest offset — so a
-- row naming a later copy says the earlier one was delivered and not applied:
-- lost, then rescued by the later copy. The chaos suite's audit reads this
-- against the broker's log.
ALTER TABLE inbox ADD COLUMN source_partition integer, ADD COLUMN source_offset bigint;
