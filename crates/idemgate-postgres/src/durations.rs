//! Each route's execution history (`Store::record_duration`), for the
//! `Retry-After` of a 409: `<table>_durations`, one row per (route, slot),
//! at most `estimate::WINDOW` slots per route and about `estimate::MAX_ROUTES`
//! routes: a new route's first record deletes the least recently recorded
//! routes beyond `MAX_ROUTES - 1` (two new routes racing may both pass the
//! count; the next new route trims it back). A route's first `WINDOW`
//! executions fill slots 0.., later ones overwrite a random slot. One
//! statement (a data-modifying `WITH`), no read that decides whether to write.

use std::time::Duration;

use idemgate_core::StoreError;
use idemgate_core::estimate::{MAX_ROUTES, WINDOW, route_key};
use sqlx::{AssertSqlSafe, PgPool};

use crate::error::store_error;
use crate::sql::Names;

/// The statements over the durations table of one record table.
#[derive(Debug)]
pub(crate) struct DurationStatements {
    record: String,
    read: String,
}

impl DurationStatements {
    pub(crate) fn new(names: &Names) -> Self {
        let d = names.suffixed("durations");
        Self {
            record: format!(
                "WITH r AS (SELECT count(*) AS n FROM {d} WHERE route = $1), \
                 evicted AS ( \
                     DELETE FROM {d} WHERE (SELECT n FROM r) = 0 \
                     AND route IN (SELECT route FROM {d} GROUP BY route \
                                   ORDER BY max(recorded_at) \
                                   LIMIT greatest((SELECT count(DISTINCT route) FROM {d}) \
                                                  - {MAX_ROUTES} + 1, 0)) \
                 ) \
                 INSERT INTO {d} (route, slot, micros, recorded_at) \
                 SELECT $1, (CASE WHEN r.n < {WINDOW} THEN r.n \
                                  ELSE floor(random() * {WINDOW})::bigint END)::smallint, \
                        $2, clock_timestamp() \
                 FROM r \
                 ON CONFLICT (route, slot) DO UPDATE \
                 SET micros = EXCLUDED.micros, recorded_at = EXCLUDED.recorded_at"
            ),
            read: format!("SELECT micros FROM {d} WHERE route = $1"),
        }
    }
}

/// The statements that take schema version 5 to 6: the durations table.
pub(crate) fn schema(names: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             route  TEXT     NOT NULL, \
             slot   SMALLINT NOT NULL CHECK (slot >= 0 AND slot < {WINDOW}), \
             micros BIGINT   NOT NULL CHECK (micros >= 0), \
             recorded_at TIMESTAMPTZ NOT NULL, \
             PRIMARY KEY (route, slot) \
         )",
        names.suffixed("durations")
    )]
}

pub(crate) async fn record(
    pool: &PgPool,
    statements: &DurationStatements,
    route: &str,
    duration: Duration,
) -> Result<(), StoreError> {
    let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
    sqlx::query(AssertSqlSafe(statements.record.as_str()))
        .bind(route_key(route))
        .bind(micros)
        .execute(pool)
        .await
        .map_err(store_error)?;
    Ok(())
}

pub(crate) async fn read(
    pool: &PgPool,
    statements: &DurationStatements,
    route: &str,
) -> Result<Vec<Duration>, StoreError> {
    let micros: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(statements.read.as_str()))
        .bind(route_key(route))
        .fetch_all(pool)
        .await
        .map_err(store_error)?;
    Ok(micros
        .into_iter()
        .map(|micros| Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
        .collect())
}
