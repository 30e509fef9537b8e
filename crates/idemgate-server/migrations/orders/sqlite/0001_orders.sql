-- The orders table (PROTOCOL §11: one order per operation id, whatever the
-- idempotency store). Idempotent, so that a database a release before these
-- migrations created (an `orders` table and its indexes already there) is
-- adopted as it is: `OrdersDb::migrate` first adds the columns such a table may
-- lack (SQLite has no ADD COLUMN IF NOT EXISTS), then this finds it complete.
CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id TEXT NOT NULL UNIQUE,
    principal TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0),
    currency TEXT NOT NULL,
    items TEXT NOT NULL,
    charge_id TEXT,
    status TEXT NOT NULL,
    -- The client-chosen id of `PUT /api/v1/orders/{order_id}` (PROTOCOL §15).
    client_order_id TEXT,
    created_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    -- What a `PATCH` may change, and the version every change increments
    -- (PROTOCOL §17).
    note TEXT,
    shipping_address TEXT,
    version BIGINT NOT NULL DEFAULT 1
);

CREATE INDEX IF NOT EXISTS orders_by_principal ON orders (principal, id);

CREATE UNIQUE INDEX IF NOT EXISTS orders_by_client_id ON orders (principal, client_order_id);
