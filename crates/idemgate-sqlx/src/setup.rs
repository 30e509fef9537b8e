//! Setting a SQL store up: the one rule its migration keeps about schema versions,
//! and the errors of opening, migrating and starting the purge task.

/// A database migrated by a newer build than this one: an older build must not
/// write to it ([`SetupError::SchemaTooNew`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("idemgate schema version {found} is newer than this build supports ({supported})")]
pub struct SchemaTooNew {
    /// The version recorded in the database.
    pub found: i64,
    /// The newest version this build knows.
    pub supported: i64,
}

/// What can go wrong setting a SQL store up, outside its `Store` methods (which
/// answer `StoreError`): opening or connecting, migrating, starting the purge task.
/// One type for both SQL stores (`idemgate_sqlite::Error` and
/// `idemgate_postgres::Error` name it), so an application that starts either
/// handles one error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The database could not be reached, opened or created.
    #[error("could not open the idemgate database")]
    Connect(#[source] sqlx::Error),
    /// The migration's statements failed.
    #[error("idemgate migration failed")]
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
    /// The purge task was started outside a tokio runtime.
    #[error("no tokio runtime to run the purge task on")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
}

impl From<SchemaTooNew> for SetupError {
    fn from(too_new: SchemaTooNew) -> Self {
        let SchemaTooNew { found, supported } = too_new;
        Self::SchemaTooNew { found, supported }
    }
}

/// What a migration does with its table, given the schema version recorded for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaStep {
    /// The table is at this build's version: nothing to run (no DDL at all, so a
    /// role without `CREATE` can migrate on every start).
    UpToDate,
    /// Nothing recorded yet, or an older version: run the steps from `found` on.
    Migrate {
        /// The version recorded, if any.
        found: Option<i64>,
    },
}

/// Decides the migration's step: a version newer than `supported` is
/// [`SchemaTooNew`], never overwritten.
pub fn schema_step(found: Option<i64>, supported: i64) -> Result<SchemaStep, SchemaTooNew> {
    match found {
        Some(found) if found > supported => Err(SchemaTooNew { found, supported }),
        Some(found) if found == supported => Ok(SchemaStep::UpToDate),
        found => Ok(SchemaStep::Migrate { found }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_schemas_are_refused_current_ones_left_alone() {
        assert_eq!(
            schema_step(Some(3), 2),
            Err(SchemaTooNew {
                found: 3,
                supported: 2
            })
        );
        assert_eq!(schema_step(Some(2), 2).unwrap(), SchemaStep::UpToDate);
        assert_eq!(
            schema_step(None, 2).unwrap(),
            SchemaStep::Migrate { found: None }
        );
        assert_eq!(
            schema_step(Some(1), 2).unwrap(),
            SchemaStep::Migrate { found: Some(1) }
        );
    }
}
