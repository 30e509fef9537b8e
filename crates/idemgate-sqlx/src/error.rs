//! How a `sqlx` error becomes a [`StoreError`].

use idemgate_core::StoreError;

use crate::SqlStore;

/// How an error from `sqlx` is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The database cannot answer now: unreachable, timing out, busy, shutting down,
    /// out of connections. [`StoreError::Unavailable`]: retry later.
    Transient,
    /// A row, or a database file, that cannot be decoded. [`StoreError::Corrupt`].
    Corrupt,
    /// Anything else (a missing table, a permission error, a read-only file): still
    /// [`StoreError::Unavailable`], so the layer fails closed, but logged as
    /// unexpected.
    Unexpected,
}

/// Classifies `err` by its `sqlx` variant — transport and pool failures are
/// transient, decoding failures corrupt — and a database error by its code, through
/// [`SqlStore::classify_code`]. Never by message text.
pub fn classify<S: SqlStore>(err: &sqlx::Error) -> ErrorClass {
    use sqlx::Error as E;
    match err {
        E::Io(_)
        | E::Tls(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed
        | E::Protocol(_)
        | E::BeginFailed => ErrorClass::Transient,
        E::ColumnDecode { .. }
        | E::Decode(_)
        | E::ColumnNotFound(_)
        | E::ColumnIndexOutOfBounds { .. }
        | E::TypeNotFound { .. }
        | E::RowNotFound => ErrorClass::Corrupt,
        E::Database(db) => db
            .code()
            .map_or(ErrorClass::Unexpected, |code| S::classify_code(&code)),
        _ => ErrorClass::Unexpected,
    }
}

/// Turns a `sqlx` error into the store's error, keeping it as the source; an
/// [`ErrorClass::Unexpected`] one is logged at `error` level.
pub fn store_error<S: SqlStore>(err: sqlx::Error) -> StoreError {
    match classify::<S>(&err) {
        ErrorClass::Transient => StoreError::unavailable(err),
        ErrorClass::Corrupt => StoreError::corrupt(err),
        ErrorClass::Unexpected => {
            tracing::error!(
                error = %err,
                "unexpected {} error in the idempotency store",
                S::BACKEND
            );
            StoreError::unavailable(err)
        }
    }
}
