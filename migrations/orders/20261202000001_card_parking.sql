-- A legacy card value the vault refuses (not a card number) is parked, not
-- retried forever: the backfill records why and goes on with the rows after
-- it. Parked rows are listed for an operator (`order-api review`).
ALTER TABLE orders ADD COLUMN card_parked text;
