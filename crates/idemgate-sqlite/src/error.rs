//! The crate's own errors, and how `sqlx` errors become [`StoreError`]s: by `sqlx`
//! error variant and SQLite result code ([`RESULT_CODES`]). Every other module
//! classifies through here; this one imports nothing of the crate.

use idemgate_core::StoreError;
use idemgate_sqlx::{ErrorClass, ErrorCodes};

/// What can go wrong outside the [`idemgate_core::Store`] methods: opening the
/// database, migrating, and starting the purge task (store methods answer
/// [`StoreError`]). The same type for both SQL stores.
pub use idemgate_sqlx::SetupError as Error;

// Primary result codes (https://www.sqlite.org/rescode.html). Extended codes carry
// the primary one in their low byte.
const SQLITE_ERROR: i32 = 1;
const SQLITE_PERM: i32 = 3;
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_NOMEM: i32 = 7;
const SQLITE_INTERRUPT: i32 = 9;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_PROTOCOL: i32 = 15;
const SQLITE_AUTH: i32 = 23;
const SQLITE_NOTADB: i32 = 26;

/// Whether `error` is SQLite's "database is locked" (`SQLITE_BUSY`, any extended
/// code): for callers that retry what SQLite does not wait for itself, such as two
/// processes switching one fresh file to WAL at once.
pub fn is_busy(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(error) = error else {
        return false;
    };
    error
        .try_downcast_ref::<sqlx::sqlite::SqliteError>()
        .is_some()
        && error
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| code & 0xff == SQLITE_BUSY)
}

/// How SQLite's errors are classified: by extended result code
/// ([`classify_result_code`]). The store's [`idemgate_sqlx::SqlStore::ERRORS`].
pub(crate) const RESULT_CODES: ErrorCodes = ErrorCodes {
    backend: "SQLite",
    classify_code: classify_result_code,
};

/// Classifies SQLite's extended result code, as sqlx reports it (in decimal).
fn classify_result_code(code: &str) -> ErrorClass {
    code.parse::<i32>()
        .map_or(ErrorClass::Unexpected, classify_code)
}

fn classify_code(code: i32) -> ErrorClass {
    // Plain `SQLITE_ERROR` (no extended code) is how SQLite answers a statement that
    // names a table or column the file does not have; the store's statements are
    // fixed, so from them it means the schema is not the one `migrate()` creates.
    // SQLite gives "no such table" no code of its own.
    if code == SQLITE_ERROR {
        return ErrorClass::Misconfigured;
    }
    match code & 0xff {
        // The file or the process may not write, or an authorizer refused.
        SQLITE_PERM | SQLITE_READONLY | SQLITE_AUTH => ErrorClass::Misconfigured,
        SQLITE_BUSY | SQLITE_LOCKED | SQLITE_NOMEM | SQLITE_INTERRUPT | SQLITE_IOERR
        | SQLITE_FULL | SQLITE_CANTOPEN | SQLITE_PROTOCOL => ErrorClass::Transient,
        SQLITE_CORRUPT | SQLITE_NOTADB => ErrorClass::Corrupt,
        _ => ErrorClass::Unexpected,
    }
}

/// How `err` is treated: by `sqlx` error variant and SQLite result code
/// ([`ErrorCodes::classify`]), never by message text.
pub(crate) fn classify(err: &sqlx::Error) -> ErrorClass {
    RESULT_CODES.classify(err)
}

/// Turns a `sqlx` error into the store's error, keeping it as the source, as
/// [`classify`] says ([`ErrorCodes::store_error`]).
pub(crate) fn store_error(err: sqlx::Error) -> StoreError {
    RESULT_CODES.store_error(err)
}

/// A claim found no record to report although its insert conflicted.
#[derive(Debug, thiserror::Error)]
#[error("the idempotency record changed while it was claimed; retry")]
pub(crate) struct ClaimContended;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes() {
        assert_eq!(classify_code(5), ErrorClass::Transient); // SQLITE_BUSY
        assert_eq!(classify_code(5 | (2 << 8)), ErrorClass::Transient); // SQLITE_BUSY_SNAPSHOT
        assert_eq!(classify_code(6), ErrorClass::Transient); // SQLITE_LOCKED
        assert_eq!(classify_code(10 | (3 << 8)), ErrorClass::Transient); // SQLITE_IOERR_WRITE
        assert_eq!(classify_code(11), ErrorClass::Corrupt);
        assert_eq!(classify_code(26), ErrorClass::Corrupt);
        assert_eq!(classify_code(19 | (8 << 8)), ErrorClass::Unexpected); // constraint
        assert_eq!(classify_code(1), ErrorClass::Misconfigured); // SQLITE_ERROR: no such table
        assert_eq!(classify_code(1 | (2 << 8)), ErrorClass::Unexpected); // SQLITE_ERROR_RETRY
        assert_eq!(classify_code(8), ErrorClass::Misconfigured); // SQLITE_READONLY
        assert_eq!(classify_code(8 | (3 << 8)), ErrorClass::Misconfigured); // READONLY_ROLLBACK
        assert_eq!(classify_code(23), ErrorClass::Misconfigured); // SQLITE_AUTH
        assert_eq!(classify_result_code("517"), ErrorClass::Transient); // SQLITE_BUSY_SNAPSHOT
        assert_eq!(classify_result_code("2067"), ErrorClass::Unexpected); // UNIQUE constraint
        assert_eq!(classify_result_code("not a number"), ErrorClass::Unexpected);
    }

    #[test]
    fn pool_errors_are_transient() {
        assert_eq!(classify(&sqlx::Error::PoolTimedOut), ErrorClass::Transient);
        assert_eq!(classify(&sqlx::Error::PoolClosed), ErrorClass::Transient);
        assert_eq!(classify(&sqlx::Error::RowNotFound), ErrorClass::Corrupt);
    }
}
