//! Each route's execution history (`Store::record_duration`), for the
//! `Retry-After` of a 409: `<table>_durations`, one row per (route, slot), at
//! most `estimate::WINDOW` slots per route and `estimate::MAX_ROUTES` routes:
//! a trigger on a new route's first row deletes the least recently recorded
//! route when there are more (in the same statement; the writer runs one write
//! at a time, so the count cannot race). A route's first `WINDOW` executions
//! fill slots 0.., later ones overwrite a random slot: one statement through
//! the writer, no read that decides whether to write.

use std::time::Duration;

use idemgate_core::StoreError;
use idemgate_core::estimate::{MAX_ROUTES, WINDOW, route_key};
use sqlx::{AssertSqlSafe, SqlitePool};

use crate::error::store_error;
use crate::sql::quote;
use crate::writer::Statement;

/// The statements over the durations table of one record table.
#[derive(Debug)]
pub(crate) struct DurationStatements {
    record: String,
    read: String,
}

impl DurationStatements {
    pub(crate) fn new(table: &str) -> Self {
        let d = quote(&format!("{table}_durations"));
        Self {
            record: format!(
                "INSERT INTO {d} (route, slot, micros, recorded_at) \
                 SELECT ?1, CASE WHEN r.n < {WINDOW} THEN r.n \
                                 ELSE abs(random() % {WINDOW}) END, ?2, {now} \
                 FROM (SELECT count(*) AS n FROM {d} WHERE route = ?1) AS r WHERE true \
                 ON CONFLICT (route, slot) DO UPDATE \
                 SET micros = excluded.micros, recorded_at = excluded.recorded_at",
                now = crate::sql::NOW,
            ),
            read: format!("SELECT micros FROM {d} WHERE route = ?1"),
        }
    }

    /// The write of one duration, for the writer.
    pub(crate) fn record(&self, route: &str, duration: Duration) -> Statement {
        let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
        sqlx::query(AssertSqlSafe(self.record.clone()))
            .bind(route_key(route).to_owned())
            .bind(micros)
    }
}

/// The statements that take schema version 4 to 5: the durations table and
/// the trigger that bounds its routes.
pub(crate) fn schema(table: &str) -> Vec<String> {
    let d = quote(&format!("{table}_durations"));
    let bound = quote(&format!("{table}_durations_bound"));
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {d} ( \
                 route       TEXT    NOT NULL, \
                 slot        INTEGER NOT NULL CHECK (slot >= 0 AND slot < {WINDOW}), \
                 micros      INTEGER NOT NULL CHECK (micros >= 0), \
                 recorded_at INTEGER NOT NULL, \
                 PRIMARY KEY (route, slot) \
             ) WITHOUT ROWID"
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {bound} AFTER INSERT ON {d} \
             WHEN NEW.slot = 0 AND (SELECT count(DISTINCT route) FROM {d}) > {MAX_ROUTES} \
             BEGIN \
                 DELETE FROM {d} WHERE route = ( \
                     SELECT route FROM {d} WHERE route <> NEW.route \
                     GROUP BY route ORDER BY max(recorded_at) LIMIT 1); \
             END"
        ),
    ]
}

pub(crate) async fn read(
    pool: &SqlitePool,
    statements: &DurationStatements,
    route: &str,
) -> Result<Vec<Duration>, StoreError> {
    let micros: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(statements.read.clone()))
        .bind(route_key(route).to_owned())
        .fetch_all(pool)
        .await
        .map_err(store_error)?;
    Ok(micros
        .into_iter()
        .map(|micros| Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
        .collect())
}
