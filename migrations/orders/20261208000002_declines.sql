-- A client's declined payments of the last hour, counted before a new card
-- goes to the vault (API_DECLINES_PER_HOUR: card testing shows as declines).
CREATE INDEX orders_declined ON orders (client_id, updated_at) WHERE cancel_reason = 'payment_declined';
