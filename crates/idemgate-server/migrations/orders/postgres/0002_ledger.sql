-- The ledger's accounts and transfers (PROTOCOL §18; the statements that use
-- them are in `src/orders/ledger.rs`). Idempotent, so that a database a release
-- before these migrations created is adopted as it is.
CREATE TABLE IF NOT EXISTS accounts (
    id BIGSERIAL PRIMARY KEY,
    operation_id UUID NOT NULL UNIQUE,
    principal TEXT NOT NULL,
    -- Never negative: this, and the debit's condition.
    balance BIGINT NOT NULL CHECK (balance >= 0),
    currency TEXT NOT NULL,
    version BIGINT NOT NULL DEFAULT 1
);

CREATE TABLE IF NOT EXISTS transfers (
    id BIGSERIAL PRIMARY KEY,
    from_account BIGINT NOT NULL REFERENCES accounts (id),
    to_account BIGINT NOT NULL REFERENCES accounts (id),
    amount BIGINT NOT NULL CHECK (amount > 0),
    -- The client's reference: one transfer per reference and debited account.
    reference_id TEXT NOT NULL,
    balance_after BIGINT NOT NULL,
    UNIQUE (from_account, reference_id)
);
