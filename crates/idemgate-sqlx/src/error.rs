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
    /// The store is set up wrong: its table is missing (`migrate()` never ran for
    /// it) or the database refuses the role access. Retrying does not help.
    /// [`StoreError::Misconfigured`], with a [`Misconfiguration`] naming the fix.
    Misconfigured,
    /// Anything else: still [`StoreError::Unavailable`], so the layer fails closed,
    /// but logged as unexpected.
    Unexpected,
}

/// The cause of a [`StoreError::Misconfigured`] from a SQL store: what the database
/// said, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the idemgate {backend} record table is missing or not accessible: run the store's \
     migrate() (its open/connect constructor does), and grant the database role \
     SELECT, INSERT, UPDATE and DELETE on it"
)]
pub struct Misconfiguration {
    /// The database's name (`"PostgreSQL"`, `"SQLite"`).
    pub backend: &'static str,
    /// What the database answered.
    #[source]
    pub cause: sqlx::Error,
}

/// How one database's errors are read: its name, for messages, and how it
/// classifies its error codes.
///
/// A store crate defines one, as a constant in its error module, and names it as
/// its [`SqlStore::ERRORS`]: so every module of the store classifies errors
/// through its error module, without naming the store type.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCodes {
    /// The database's name for log messages and [`Misconfiguration`]
    /// (`"PostgreSQL"`, `"SQLite"`).
    pub backend: &'static str,
    /// Classifies a database error by its code (a PostgreSQL SQLSTATE, SQLite's
    /// extended result code in decimal).
    pub classify_code: fn(&str) -> ErrorClass,
}

impl ErrorCodes {
    /// Classifies `err` by its `sqlx` variant — transport and pool failures are
    /// transient, decoding failures corrupt — and a database error by its code,
    /// through [`ErrorCodes::classify_code`]. Never by message text.
    pub fn classify(&self, err: &sqlx::Error) -> ErrorClass {
        classify_by(err, self.classify_code)
    }

    /// Turns a `sqlx` error into the store's error, keeping it as the source; an
    /// [`ErrorClass::Unexpected`] one is logged at `error` level.
    pub fn store_error(&self, err: sqlx::Error) -> StoreError {
        match self.classify(&err) {
            ErrorClass::Transient => StoreError::unavailable(err),
            ErrorClass::Corrupt => StoreError::corrupt(err),
            ErrorClass::Misconfigured => StoreError::misconfigured(Misconfiguration {
                backend: self.backend,
                cause: err,
            }),
            ErrorClass::Unexpected => {
                tracing::error!(
                    error = %err,
                    "unexpected {} error in the idempotency store",
                    self.backend
                );
                StoreError::unavailable(err)
            }
        }
    }
}

/// [`ErrorCodes::classify`] with the store's [`SqlStore::ERRORS`].
pub fn classify<S: SqlStore>(err: &sqlx::Error) -> ErrorClass {
    S::ERRORS.classify(err)
}

fn classify_by(err: &sqlx::Error, by_code: impl FnOnce(&str) -> ErrorClass) -> ErrorClass {
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
            .map_or(ErrorClass::Unexpected, |code| by_code(&code)),
        _ => ErrorClass::Unexpected,
    }
}

/// [`ErrorCodes::store_error`] with the store's [`SqlStore::ERRORS`].
pub fn store_error<S: SqlStore>(err: sqlx::Error) -> StoreError {
    S::ERRORS.store_error(err)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use sqlx::error::{DatabaseError, ErrorKind};

    use super::*;

    /// A database error with a code, or none.
    #[derive(Debug, thiserror::Error)]
    #[error("database error")]
    struct Coded(Option<&'static str>);

    impl DatabaseError for Coded {
        fn message(&self) -> &str {
            "database error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            self.0.map(Cow::Borrowed)
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    fn never_a_code(code: &str) -> ErrorClass {
        panic!("only database errors have codes, got {code}")
    }

    #[test]
    fn variants_are_classified_without_the_backend() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        for (err, class) in [
            (sqlx::Error::Io(io), ErrorClass::Transient),
            (sqlx::Error::PoolTimedOut, ErrorClass::Transient),
            (sqlx::Error::PoolClosed, ErrorClass::Transient),
            (sqlx::Error::WorkerCrashed, ErrorClass::Transient),
            (sqlx::Error::BeginFailed, ErrorClass::Transient),
            (sqlx::Error::RowNotFound, ErrorClass::Corrupt),
            (
                sqlx::Error::ColumnNotFound("token".into()),
                ErrorClass::Corrupt,
            ),
            (sqlx::Error::Decode("bad".into()), ErrorClass::Corrupt),
        ] {
            assert_eq!(classify_by(&err, never_a_code), class, "{err:?}");
        }
    }

    #[test]
    fn database_errors_are_classified_by_their_code() {
        let coded = sqlx::Error::Database(Box::new(Coded(Some("57014"))));
        let class = classify_by(&coded, |code| {
            assert_eq!(code, "57014");
            ErrorClass::Transient
        });
        assert_eq!(class, ErrorClass::Transient);
        let uncoded = sqlx::Error::Database(Box::new(Coded(None)));
        assert_eq!(classify_by(&uncoded, never_a_code), ErrorClass::Unexpected);
    }
}
