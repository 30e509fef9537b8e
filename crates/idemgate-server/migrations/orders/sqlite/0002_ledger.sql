-- The ledger's accounts and transfers (PROTOCOL §18; the statements that use
-- them are in `src/orders/ledger.rs`). Idempotent, so that a database a release
-- before these migrations created is adopted as it is.
CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id TEXT NOT NULL UNIQUE,
    principal TEXT NOT NULL,
    -- Never negative: this, and the debit's condition.
    balance INTEGER NOT NULL CHECK (balance >= 0),
    currency TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 1
);

CREATE TABLE IF NOT EXISTS transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    from_account INTEGER NOT NULL REFERENCES accounts (id),
    to_account INTEGER NOT NULL REFERENCES accounts (id),
    amount INTEGER NOT NULL CHECK (amount > 0),
    -- The client's reference: one transfer per reference and debited account.
    reference_id TEXT NOT NULL,
    balance_after INTEGER NOT NULL,
    UNIQUE (from_account, reference_id)
);
