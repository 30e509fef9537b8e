-- The payment gateway's confirmation of an order's charge (`POST
-- /webhooks/payments`, `src/orders/webhook.rs`): when it came (Unix
-- milliseconds) and the id of the event that brought it. Written in the
-- transaction that also completes the event's idempotency record (the inbox
-- pattern), so an event marks its order once, whatever is redelivered or
-- crashes. NULL until the gateway confirms.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS payment_confirmed_at BIGINT;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS payment_event_id TEXT;
