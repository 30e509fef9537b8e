-- The orders table (PROTOCOL §11: one order per operation id, whatever the
-- idempotency store). Idempotent, so that a database a release before these
-- migrations created is adopted as it is: the table of the first release, then
-- the columns later releases added, each only where it is missing.
CREATE TABLE IF NOT EXISTS orders (
    id BIGSERIAL PRIMARY KEY,
    operation_id UUID NOT NULL UNIQUE,
    principal TEXT NOT NULL,
    amount BIGINT NOT NULL CHECK (amount > 0),
    currency TEXT NOT NULL,
    items TEXT NOT NULL,
    charge_id TEXT,
    status TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The client-chosen id of `PUT /api/v1/orders/{order_id}` (PROTOCOL §15).
ALTER TABLE orders ADD COLUMN IF NOT EXISTS client_order_id TEXT;

-- What a `PATCH` may change, and the version every change increments
-- (PROTOCOL §17).
ALTER TABLE orders ADD COLUMN IF NOT EXISTS note TEXT;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS shipping_address TEXT;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 1;

CREATE INDEX IF NOT EXISTS orders_by_principal ON orders (principal, id);

CREATE UNIQUE INDEX IF NOT EXISTS orders_by_client_id ON orders (principal, client_order_id);
