//! PostgreSQL store for idemgate, on `sqlx`.
//!
//! [`PostgresStore`] keeps idempotency records in a PostgreSQL table, so every
//! instance of a service shares them and they survive restarts. It implements
//! [`idemgate_core::Store`]: each claim is one `INSERT … ON CONFLICT … DO UPDATE …
//! RETURNING` statement, every later write is fenced on the claim's (operation id,
//! fencing token), and all times come from the database's `clock_timestamp()`, so
//! instances with skewed clocks agree.
//!
//! It also offers the **transactional mode**: the [`Tx`] extractor lends a handler a
//! database transaction, and the idempotency layer commits the handler's business
//! writes and the `COMPLETED` record in that same transaction — or neither.
//!
//! # Quick start
//!
//! [`PostgresStore::connect`] connects and migrates in one call:
//!
//! ```no_run
//! # async fn run() -> Result<(), idemgate_postgres::Error> {
//! let store = idemgate_postgres::PostgresStore::connect("postgres://app@127.0.0.1/app").await?;
//! # Ok(()) }
//! ```
//!
//! With a pool of your own, [`PostgresStore::new`] creates nothing; migrate it:
//!
//! ```no_run
//! use idemgate_postgres::PostgresStore;
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The store's settings (a checkout pings only a connection idle for a while)
//! // with your own size and timeout:
//! let pool = PostgresStore::pool_options()
//!     .max_connections(20)
//!     .acquire_timeout(Duration::from_secs(2))
//!     .connect("postgres://app@127.0.0.1/app")
//!     .await?;
//! let store = PostgresStore::new(pool);
//! store.migrate().await?; // once per start; safe from many instances at once
//! let _purge = store.spawn_purge(Duration::from_secs(300), 1_000)?;
//! // Hand `store` (or `Arc::new(store)` as an `Arc<dyn Store>`) to the layer.
//! # Ok(()) }
//! ```
//!
//! TLS is not enabled by this crate: enable `sqlx`'s `tls-rustls` or
//! `tls-native-tls` feature in the application.
//!
//! # Schema
//!
//! [`PostgresStore::migrate`] creates (names follow [`PostgresStore::with_table`] and
//! [`PostgresStore::with_schema`]):
//!
//! ```sql
//! CREATE SEQUENCE idemgate_records_token_seq;          -- fencing tokens
//! CREATE TABLE idemgate_records (
//!     identity         BYTEA PRIMARY KEY,               -- SHA-256 of principal, method, path, key
//!     principal        TEXT NOT NULL,                   -- the readable parts of the identity
//!     method           TEXT NOT NULL,
//!     path             TEXT NOT NULL,
//!     idempotency_key  TEXT NOT NULL,
//!     fingerprint      BYTEA NOT NULL,                  -- SHA-256 of the request
//!     format_version   INTEGER NOT NULL,
//!     operation_id     UUID NOT NULL,
//!     token            BIGINT NOT NULL,
//!     status           TEXT NOT NULL,                   -- PROCESSING | COMPLETED | FAILED | RELEASED
//!     lease_origin     TEXT NOT NULL,                   -- NEW | RELEASED | TAKEN_OVER: how the last claim came about
//!     locked_until     TIMESTAMPTZ,                     -- end of the lease while PROCESSING
//!     response_status  INTEGER,                         -- set when COMPLETED / FAILED
//!     response_headers BYTEA,                           -- StoredResponse::encode_fields
//!     response_body    BYTEA,                           -- NULL when not retained
//!     body_retained    BOOLEAN,                         -- false: "not retained", true: body (maybe empty)
//!     created_at       TIMESTAMPTZ NOT NULL,
//!     expires_at       TIMESTAMPTZ NOT NULL             -- past it, the record is absent
//! );
//! CREATE INDEX idemgate_records_expires_at_idx ON idemgate_records (expires_at);
//! CREATE TABLE idemgate_records_resource_leases (     -- Store::acquire_resource_lease (schema version 2)
//!     resource    BYTEA PRIMARY KEY,                   -- ResourceId: SHA-256 of the resource's name
//!     token       BYTEA NOT NULL,                      -- the holder's LeaseToken (16 bytes)
//!     acquired_at TIMESTAMPTZ NOT NULL,
//!     expires_at  TIMESTAMPTZ NOT NULL                  -- past it, the next acquisition replaces the row
//! );
//! CREATE TABLE idemgate_records_durations (          -- Store::record_duration (schema version 6)
//!     route       TEXT,                                -- method and scope path; at most 1024 routes
//!     slot        SMALLINT,                            -- 0..31: at most 32 durations per route
//!     micros      BIGINT NOT NULL,                     -- one execution's duration
//!     recorded_at TIMESTAMPTZ NOT NULL,                -- the least recently recorded route makes way
//!     PRIMARY KEY (route, slot)
//! );
//! CREATE TABLE idemgate_records_stream_pieces (      -- Store::append_stream_piece (schema version 7)
//!     identity     BYTEA REFERENCES idemgate_records (identity) ON DELETE CASCADE,
//!     operation_id UUID,                               -- the run whose stream it is
//!     token        BIGINT,
//!     idx          INTEGER,                            -- 0: the head, then the body's pieces
//!     piece        BYTEA NOT NULL,
//!     PRIMARY KEY (identity, operation_id, token, idx)
//! );
//! CREATE TABLE idemgate_schema_versions (table_name TEXT PRIMARY KEY, version BIGINT, migrated_at TIMESTAMPTZ);
//! ```
//!
//! (plus `CHECK` constraints on the status values, digest lengths and response
//! columns). The schema version lives in `idemgate_schema_versions`, keyed by table
//! name, not in sqlx's `_sqlx_migrations`: the table can live in the application's
//! database beside its own `sqlx::migrate!` migrations. `migrate()` takes a
//! transaction-scoped advisory lock, so instances that start together do not race.
//!
//! # How each operation runs
//!
//! - **Claim**: one statement inserts a `PROCESSING` record, or — in its `ON CONFLICT
//!   DO UPDATE … WHERE` — replaces an expired record (a new operation id), or takes over
//!   a `RELEASED` record or a lapsed lease with the same fingerprint (same operation
//!   id). Every claim draws a new token from the sequence. When the statement returns
//!   no row, a read reports the record that blocked it; if that record expired,
//!   vanished or became claimable in between, the claim statement runs again (a few
//!   times at most). The read never decides to insert.
//! - **complete / release / renew / delete**: one statement each, matching identity,
//!   operation id, token, `status = 'PROCESSING'` and `expires_at > clock_timestamp()`;
//!   zero rows is [`FencedWrite::Refused`](idemgate_core::FencedWrite::Refused).
//! - **Stream pieces**: an append is one `INSERT … SELECT` from the record under
//!   the same fence, `FOR SHARE` (so it is ordered with the run's end), `ON CONFLICT
//!   … DO UPDATE` (an index appended again is replaced); zero rows is `Refused`. A
//!   read is one `SELECT` joined to the record: only while the record names the
//!   run (operation id, token, not expired), in order, up to the first missing index.
//! - **Pieces' lifetime**: they reference the record `ON DELETE CASCADE`, so purge,
//!   eviction and deletion take them along. A takeover or the replacement of an
//!   expired record (same row, another run) leaves the earlier run's pieces until
//!   the row goes — the claim statement does not look at them — and no read
//!   returns them.
//! - **Expiry**: every statement treats a record past `expires_at` as absent, purged
//!   or not. [`PostgresStore::purge_expired`] deletes them in bounded batches
//!   (`FOR UPDATE SKIP LOCKED`); [`PostgresStore::spawn_purge`] runs it periodically.
//! - **Wait mode**: [`Store::wait_for_change`](idemgate_core::Store::wait_for_change)
//!   is woken in process by completions, releases, deletes and stream pieces made
//!   through this store (transactional commits included), and across instances by
//!   `LISTEN/NOTIFY`: a waiter marks the record (`waited`), and the statement that
//!   ends a marked run, or appends a piece to its stream, calls `pg_notify`
//!   (delivered at commit). Unmarked runs notify nothing. Each
//!   store listens on one connection of its own (not one of its pool's), opened at
//!   the first wait.
//!
//! # Errors
//!
//! Errors are classified by `sqlx` error variant and SQLSTATE, never by message text:
//! I/O and TLS failures, pool timeouts, a closed pool, connection exceptions (`08*`),
//! `statement_timeout` and `lock_timeout` (`57014`, `55P03`), shutdowns (`57P*`),
//! resource exhaustion (`53*`, e.g. `53300` too many connections), serialization
//! failures and deadlocks are [`StoreError::Unavailable`](idemgate_core::StoreError::Unavailable)
//! (the layer's 503). A row that cannot be decoded is
//! [`StoreError::Corrupt`](idemgate_core::StoreError::Corrupt). A missing table or
//! schema (`42P01`, `3F000`: `migrate()` never ran for it) and a refused permission
//! (`42501`) are [`StoreError::Misconfigured`](idemgate_core::StoreError::Misconfigured):
//! the layer's 500 `store-misconfigured`, logged with the fix. Anything else is
//! logged and answered as `Unavailable`, so the layer fails closed. The `sqlx` error
//! is kept as the source.
//!
//! A server-side statement timeout is set on the pool's connect options, e.g.
//! `PgConnectOptions::new().options([("statement_timeout", "5s")])`; a statement
//! that hits it is `Unavailable`.
//!
//! # Transactional mode
//!
//! Business writes made through [`Tx`] commit in the same transaction as the
//! record's completion. The claim itself is committed before the handler runs, so the
//! operation id survives a crash. Key the business row by the operation id the
//! handler is given (the layer puts it in the request extensions), in a `UNIQUE`
//! column: a second run of the same operation (after a takeover) cannot insert twice,
//! and a run whose completion is refused leaves no row behind.
//!
//! ```no_run
//! use axum::{Router, extract::State, routing::post};
//! use idemgate_core::record::OperationId;
//! use idemgate_postgres::{PostgresStore, Tx};
//!
//! // CREATE TABLE orders (
//! //     id           BIGSERIAL PRIMARY KEY,
//! //     operation_id UUID NOT NULL UNIQUE,
//! //     amount       BIGINT NOT NULL
//! // );
//!
//! /// The part of the handler that writes; `operation_id` is the one the layer gives
//! /// the handler for this request.
//! async fn create_order(
//!     tx: &mut Tx,
//!     operation_id: OperationId,
//!     amount: i64,
//! ) -> Result<i64, sqlx::Error> {
//!     sqlx::query_scalar("INSERT INTO orders (operation_id, amount) VALUES ($1, $2) RETURNING id")
//!         .bind(operation_id.as_uuid())
//!         .bind(amount)
//!         .fetch_one(&mut **tx)
//!         .await
//! }
//!
//! async fn handler(mut tx: Tx /* , the operation id, the body … */) -> String {
//!     # let operation_id = OperationId::generate();
//!     match create_order(&mut tx, operation_id, 4_200).await {
//!         Ok(id) => format!("order {id}"), // committed by the layer with the record
//!         Err(_) => "failed".to_owned(),   // a 5xx: the layer rolls back
//!     }
//! }
//!
//! # fn app(store: PostgresStore) -> Router {
//! // The state provides the store (`FromRef`); the route sits behind IdempotencyLayer.
//! Router::new().route("/orders", post(handler)).with_state(store)
//! # }
//! ```
//!
//! Outside axum, [`Tx::begin`] does what the extractor does.
//!
//! # Very large tables: partitioning
//!
//! The claim's `ON CONFLICT (identity)` needs one unique index on `identity` across
//! the whole table, so a partitioned record table must be partitioned by `identity`:
//! **hash partitioning**. Range partitioning by time would need `expires_at` or
//! `created_at` in the primary key, which no longer makes `identity` unique — do not
//! use it. Create the table yourself before the first `migrate()` (which then only adds
//! what is missing and records the version):
//!
//! ```sql
//! CREATE TABLE idemgate_records ( /* the columns above, same types and checks */ )
//!     PARTITION BY HASH (identity);
//! CREATE TABLE idemgate_records_p0 PARTITION OF idemgate_records FOR VALUES WITH (MODULUS 8, REMAINDER 0);
//! -- … p1 … p7
//! ```
//!
//! Partitions keep each index and each autovacuum run small, and purges touch them
//! independently. Without partitioning, a purge every few minutes with a modest batch
//! and a tuned autovacuum (`autovacuum_vacuum_scale_factor` on the table) keeps the
//! table at a day's worth of records.

mod audit;
mod changes;
mod durations;
mod error;
mod migrate;
mod pieces;
mod sql;
mod store;
mod tx;

pub use error::Error;
pub use idemgate_sqlx::{
    PROBLEM_ALREADY_LENT, PROBLEM_NOT_BEHIND_LAYER, PROBLEM_UNAVAILABLE, PurgeTask, TxRejection,
};
pub use sql::SCHEMA_VERSION;
pub use store::{DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, IDLE_PING_AFTER, PostgresStore};
pub use tx::Tx;
