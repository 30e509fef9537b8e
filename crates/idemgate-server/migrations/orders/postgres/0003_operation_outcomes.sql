-- What each write of the orders service answered, by operation id
-- (`src/orders/outcome.rs`): an edit, a cancellation or an account's opening
-- records its status and body in the transaction of the write, so a run of the
-- same operation after a crash between that commit and the record's completion
-- (a takeover, or a release) answers what the first run answered instead of
-- evaluating the request again (PROTOCOL §17: the journal comes first). Rows
-- older than the idempotency records' TTL (plus a margin) are purged: no run of
-- their operation can come after that.
CREATE TABLE IF NOT EXISTS operation_outcomes (
    operation_id UUID PRIMARY KEY,
    principal TEXT NOT NULL,
    status INTEGER NOT NULL,
    body TEXT NOT NULL,
    -- Unix milliseconds, the writer's clock: what the purge compares.
    created_at BIGINT NOT NULL
);

CREATE INDEX IF NOT EXISTS operation_outcomes_by_age ON operation_outcomes (created_at);

-- An account's transfers, newest first, both ways (`GET
-- /api/v1/accounts/{id}/transfers`).
CREATE INDEX IF NOT EXISTS transfers_by_from ON transfers (from_account, id);
CREATE INDEX IF NOT EXISTS transfers_by_to ON transfers (to_account, id);
