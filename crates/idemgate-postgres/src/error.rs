//! The crate's own errors, and how `sqlx` errors become [`StoreError`]s.

use idemgate_core::StoreError;
use idemgate_sqlx::{ErrorClass, ErrorCodes};

/// What can go wrong outside the [`idemgate_core::Store`] methods: opening the
/// database, migrating, and starting the purge task (store methods answer
/// [`StoreError`]). The same type for both SQL stores.
pub use idemgate_sqlx::SetupError as Error;

/// How PostgreSQL's errors are classified: by SQLSTATE ([`classify_sqlstate`]).
/// The store's [`idemgate_sqlx::SqlStore::ERRORS`].
pub(crate) const SQLSTATES: ErrorCodes = ErrorCodes {
    backend: "PostgreSQL",
    classify_code: classify_sqlstate,
};

/// Classifies a SQLSTATE: the ones that mean "try again later" are transient, a
/// missing table or schema and a refused permission are misconfiguration, every
/// other one unexpected (still answered as unavailable, but logged).
pub(crate) fn classify_sqlstate(code: &str) -> ErrorClass {
    if is_transient_sqlstate(code) {
        ErrorClass::Transient
    } else if is_misconfiguration_sqlstate(code) {
        ErrorClass::Misconfigured
    } else {
        ErrorClass::Unexpected
    }
}

/// SQLSTATEs that mean the store is not set up for this role: `migrate()` never ran
/// (for this table or schema), or the role may not use what it created.
fn is_misconfiguration_sqlstate(code: &str) -> bool {
    matches!(
        code,
        "42P01" // undefined_table
            | "3F000" // invalid_schema_name: `with_schema` before migrate()
            | "42501" // insufficient_privilege
    )
}

/// SQLSTATEs that mean "try again later".
fn is_transient_sqlstate(code: &str) -> bool {
    code.starts_with("08") // connection exception
        || code.starts_with("57P") // admin / crash shutdown, cannot connect now
        || matches!(
            code,
            "57014" // query_canceled: statement_timeout
                | "55P03" // lock_not_available: lock_timeout
                | "53300" // too_many_connections
                | "53000" // insufficient_resources
                | "53100" // disk_full
                | "53200" // out_of_memory
                | "40001" // serialization_failure
                | "40P01" // deadlock_detected
                | "25006" // read_only_sql_transaction: a standby after failover
        )
}

/// Turns a `sqlx` error into the store's error, keeping it as the source: by error
/// variant and SQLSTATE ([`ErrorCodes::store_error`]), never by message text.
pub(crate) fn store_error(err: sqlx::Error) -> StoreError {
    SQLSTATES.store_error(err)
}

/// A claim found the record changing under it on every bounded retry.
#[derive(Debug, thiserror::Error)]
#[error("the idempotency record kept changing while it was claimed; retry")]
pub(crate) struct ClaimContended;

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(err: &sqlx::Error) -> ErrorClass {
        SQLSTATES.classify(err)
    }

    #[test]
    fn transport_and_pool_errors_are_transient() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(classify(&sqlx::Error::Io(io)), ErrorClass::Transient);
        assert_eq!(classify(&sqlx::Error::PoolTimedOut), ErrorClass::Transient);
        assert_eq!(classify(&sqlx::Error::PoolClosed), ErrorClass::Transient);
        assert_eq!(classify(&sqlx::Error::RowNotFound), ErrorClass::Corrupt);
        assert_eq!(
            classify(&sqlx::Error::ColumnNotFound("token".into())),
            ErrorClass::Corrupt
        );
    }

    #[test]
    fn sqlstates() {
        for code in [
            "08006", "08001", "57014", "57P01", "57P03", "53300", "40001",
        ] {
            assert!(is_transient_sqlstate(code), "{code}");
            assert_eq!(classify_sqlstate(code), ErrorClass::Transient, "{code}");
        }
        for code in ["42P01", "3F000", "42501"] {
            assert!(!is_transient_sqlstate(code), "{code}");
            assert_eq!(classify_sqlstate(code), ErrorClass::Misconfigured, "{code}");
        }
        for code in ["23505", "22P02", "42703"] {
            assert!(!is_transient_sqlstate(code), "{code}");
            assert_eq!(classify_sqlstate(code), ErrorClass::Unexpected, "{code}");
        }
    }
}
