//! The crate's own errors, and how `sqlx` errors become [`StoreError`]s.

use idemgate_core::StoreError;

/// What can go wrong outside the [`idemgate_core::Store`] methods: opening the
/// database, migrating, and starting the purge task. (Store methods answer
/// [`StoreError`].)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database file could not be opened or created.
    #[error("could not open the idemgate SQLite database")]
    Open(#[source] sqlx::Error),
    /// The migration's statements failed.
    #[error("idemgate SQLite migration failed")]
    Migrate(#[source] sqlx::Error),
    /// The database holds a schema newer than this build knows: an older build must
    /// not write to it.
    #[error("idemgate schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// [`crate::SqliteStore::spawn_purge`] was called outside a tokio runtime.
    #[error("no tokio runtime to run the purge task on")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
}

/// How an error from `sqlx` is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The database cannot answer now (busy, locked, I/O, out of connections).
    Transient,
    /// A row or a database file that cannot be decoded.
    Corrupt,
    /// Anything else (a missing table, a read-only file): answered as unavailable,
    /// so the layer fails closed, but logged as unexpected.
    Unexpected,
}

// Primary result codes (https://www.sqlite.org/rescode.html). Extended codes carry
// the primary one in their low byte.
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_NOMEM: i32 = 7;
const SQLITE_INTERRUPT: i32 = 9;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_PROTOCOL: i32 = 15;
const SQLITE_NOTADB: i32 = 26;

/// Classifies by error variant and SQLite result code, never by message text.
pub(crate) fn classify(err: &sqlx::Error) -> Class {
    use sqlx::Error as E;
    match err {
        E::Io(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed
        | E::Protocol(_)
        | E::BeginFailed => Class::Transient,
        E::ColumnDecode { .. }
        | E::Decode(_)
        | E::ColumnNotFound(_)
        | E::ColumnIndexOutOfBounds { .. }
        | E::TypeNotFound { .. }
        | E::RowNotFound => Class::Corrupt,
        E::Database(db) => {
            // sqlx reports SQLite's extended result code, in decimal.
            match db.code().and_then(|code| code.parse::<i32>().ok()) {
                Some(code) => classify_code(code),
                None => Class::Unexpected,
            }
        }
        _ => Class::Unexpected,
    }
}

fn classify_code(code: i32) -> Class {
    match code & 0xff {
        SQLITE_BUSY | SQLITE_LOCKED | SQLITE_NOMEM | SQLITE_INTERRUPT | SQLITE_IOERR
        | SQLITE_FULL | SQLITE_CANTOPEN | SQLITE_PROTOCOL => Class::Transient,
        SQLITE_CORRUPT | SQLITE_NOTADB => Class::Corrupt,
        _ => Class::Unexpected,
    }
}

/// Turns a `sqlx` error into the store's error, keeping it as the source.
pub(crate) fn store_error(err: sqlx::Error) -> StoreError {
    match classify(&err) {
        Class::Transient => StoreError::unavailable(err),
        Class::Corrupt => StoreError::corrupt(err),
        Class::Unexpected => {
            tracing::error!(error = %err, "unexpected SQLite error in the idempotency store");
            StoreError::unavailable(err)
        }
    }
}

/// A record read back that breaks the schema's invariants.
#[derive(Debug, thiserror::Error)]
#[error("corrupt idempotency record: {0}")]
pub(crate) struct CorruptRecord(pub(crate) &'static str);

/// A claim found no record to report although its insert conflicted.
#[derive(Debug, thiserror::Error)]
#[error("the idempotency record changed while it was claimed; retry")]
pub(crate) struct ClaimContended;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes() {
        assert_eq!(classify_code(5), Class::Transient); // SQLITE_BUSY
        assert_eq!(classify_code(5 | (2 << 8)), Class::Transient); // SQLITE_BUSY_SNAPSHOT
        assert_eq!(classify_code(6), Class::Transient); // SQLITE_LOCKED
        assert_eq!(classify_code(10 | (3 << 8)), Class::Transient); // SQLITE_IOERR_WRITE
        assert_eq!(classify_code(11), Class::Corrupt);
        assert_eq!(classify_code(26), Class::Corrupt);
        assert_eq!(classify_code(19 | (8 << 8)), Class::Unexpected); // constraint
        assert_eq!(classify_code(1), Class::Unexpected); // SQLITE_ERROR: no such table
    }

    #[test]
    fn pool_errors_are_transient() {
        assert_eq!(classify(&sqlx::Error::PoolTimedOut), Class::Transient);
        assert_eq!(classify(&sqlx::Error::PoolClosed), Class::Transient);
        assert_eq!(classify(&sqlx::Error::RowNotFound), Class::Corrupt);
    }
}
