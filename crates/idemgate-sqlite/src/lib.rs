//! SQLite store for idemgate, on `sqlx`: the embedded default.
//!
//! [`SqliteStore`] keeps idempotency records in one SQLite file: no server, durable
//! across restarts, shared by every process on the machine that opens the same file.
//! It implements [`idemgate_core::Store`] with the same guarantees as the PostgreSQL
//! store: each claim is one `INSERT … ON CONFLICT … DO UPDATE … RETURNING` under the
//! write lock, and every later write is fenced on the claim's (operation id, fencing
//! token). Concurrent writes share SQLite transactions and their `fsync`s (group
//! commit, see "How each operation runs").
//!
//! It also offers the **transactional mode**: the [`Tx`] extractor lends a handler a
//! transaction on the same file, and the idempotency layer commits the handler's
//! business writes and the `COMPLETED` record in that transaction — or neither.
//!
//! # Quick start
//!
//! ```no_run
//! use idemgate_sqlite::SqliteStore;
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), idemgate_sqlite::Error> {
//! let store = SqliteStore::open("/var/lib/myapp/idemgate.db").await?; // migrated
//! let _purge = store.spawn_purge(Duration::from_secs(300), 1_000)?;
//! // Hand `store` (or `Arc::new(store)` as an `Arc<dyn Store>`) to the layer.
//! # Ok(()) }
//! ```
//!
//! [`SqliteStore::open`] creates the file and the record table if needed (it runs
//! [`SqliteStore::migrate`]), and opens the file in WAL mode with
//! `synchronous = FULL` (a completed record survives a crash or a power loss), a 5 s
//! busy timeout and foreign keys on. [`SqliteStore::connect_options`] gives the same
//! options to adjust for a pool of your own ([`SqliteStore::new`], which creates
//! nothing: call [`SqliteStore::migrate`] before serving). SQLite is bundled (no
//! system library needed).
//!
//! # The clock
//!
//! SQLite has no server clock. The store reads SQLite's own clock,
//! `unixepoch('subsec')`, inside its statements (for a claim: once, after taking the
//! write lock), in whole milliseconds. That is the clock of the machine the file is
//! on: a WAL database is only shared by processes on one machine (not over a network
//! filesystem), so all instances agree. Where a statement would cost the writer a
//! hop of its own (after a transactional turn), the
//! store reads the same clock in the process.
//!
//! # Schema
//!
//! [`SqliteStore::migrate`] creates (`STRICT` tables; times are milliseconds since the
//! Unix epoch):
//!
//! ```sql
//! CREATE TABLE idemgate_records (
//!     identity         BLOB PRIMARY KEY,     -- SHA-256 of principal, method, path, key
//!     principal        TEXT NOT NULL,        -- the readable parts of the identity
//!     method           TEXT NOT NULL,
//!     path             TEXT NOT NULL,
//!     idempotency_key  TEXT NOT NULL,
//!     fingerprint      BLOB NOT NULL,        -- SHA-256 of the request
//!     format_version   INTEGER NOT NULL,
//!     operation_id     BLOB NOT NULL,        -- the UUID's 16 bytes
//!     token            INTEGER NOT NULL,     -- fencing token, +1 at every claim of the record
//!     status           TEXT NOT NULL,        -- PROCESSING | COMPLETED | FAILED | RELEASED
//!     lease_origin     TEXT NOT NULL,        -- NEW | RELEASED | TAKEN_OVER
//!     locked_until     INTEGER,              -- end of the lease while PROCESSING
//!     response_status  INTEGER,              -- set when COMPLETED / FAILED
//!     response_headers BLOB,                 -- StoredResponse::encode_fields
//!     response_body    BLOB,                 -- NULL when not retained
//!     body_retained    INTEGER,              -- 0: "not retained", 1: body (maybe empty)
//!     created_at       INTEGER NOT NULL,
//!     expires_at       INTEGER NOT NULL      -- past it, the record is absent
//! ) STRICT;
//! CREATE INDEX idemgate_records_expires_at_idx ON idemgate_records (expires_at);
//! CREATE TABLE idemgate_records_resource_leases (     -- Store::acquire_resource_lease (schema version 2)
//!     resource    BLOB PRIMARY KEY,                   -- ResourceId: SHA-256 of the resource's name
//!     token       BLOB NOT NULL,                      -- the holder's LeaseToken (16 bytes)
//!     acquired_at INTEGER NOT NULL,
//!     expires_at  INTEGER NOT NULL                  -- past it, the next acquisition replaces the row
//! ) STRICT;
//! CREATE TABLE idemgate_records_durations (          -- Store::record_duration (schema version 5)
//!     route       TEXT,                                -- method and scope path; at most 1024 routes
//!     slot        INTEGER,                             -- 0..31: at most 32 durations per route
//!     micros      INTEGER NOT NULL,                    -- one execution's duration
//!     recorded_at INTEGER NOT NULL,                    -- ms; the least recently recorded route makes way
//!     PRIMARY KEY (route, slot)
//! ) WITHOUT ROWID;
//! CREATE TABLE idemgate_schema_versions (table_name TEXT PRIMARY KEY, version INTEGER, migrated_at INTEGER) STRICT;
//! ```
//!
//! (plus `CHECK` constraints). The schema version lives in `idemgate_schema_versions`,
//! keyed by table name, not in sqlx's `_sqlx_migrations`, so the table can share a
//! file with the application's own migrations. The fencing token counts per record:
//! a record that is deleted or expires starts again at 1, but under a new operation
//! id, so an old (operation id, token) pair never matches a new record.
//!
//! # How each operation runs
//!
//! SQLite has one writer at a time, and with `synchronous = FULL` every commit is an
//! `fsync`: one commit per write would make the disk's flush rate the store's
//! throughput, and connections fighting for the write lock sleep in SQLite's busy
//! handler. So the store has **one writer connection, owned by a writer task**, and
//! every write goes through it (**group commit**); the pool only reads.
//!
//! - **The writer** takes the first queued write, begins an `IMMEDIATE`
//!   transaction (the write lock, waiting up to the busy timeout for other
//!   processes), reads the clock once, runs that write and every other one already
//!   queued (up to 256), and commits once: one `fsync` for the whole batch. Only
//!   then does it answer each caller, so every acknowledged write is durable.
//!   Each write is one statement, so one that fails is undone by SQLite alone and
//!   the others commit; an error after which SQLite may have rolled the whole
//!   transaction back (busy, I/O, full disk, out of memory, corruption), or a
//!   failed `COMMIT`, fails the whole batch: every caller in it gets
//!   [`StoreError::Unavailable`](idemgate_core::StoreError::Unavailable), none is
//!   acknowledged. A write that waited in the queue longer than [`DEFAULT_BUSY_TIMEOUT`]
//!   is answered `Unavailable` without running; one whose caller gave up is
//!   skipped. Between batches the writer holds no lock, so other processes on the
//!   same file write in turn (each waiting up to the busy timeout, as before).
//!   [`SqliteStore::writer_stats`] counts its commits (by a commit hook: SQLite's
//!   own count) and writes.
//! - **Claim**: first a read on the pool. A record that is there and that this
//!   request may not take (`Record::claim_origin`: a replay, a 409, a 422) is
//!   answered from it, never waiting behind the writer. Otherwise the writer runs
//!   the upsert, the one atomic claim: it inserts a `PROCESSING` record, replaces
//!   an expired one (new operation id), or takes over a `RELEASED` record or a
//!   lapsed lease with the same fingerprint (same operation id); when it changes
//!   nothing, the record that blocked it is read in the same transaction.
//! - **complete / release / renew / delete / evict / purge**: through the writer,
//!   one statement each (purge: one per batch of rows), fenced on identity,
//!   operation id, token, `status = 'PROCESSING'` and not expired. The eviction's
//!   delete and the read explaining a refusal share the batch's transaction.
//! - **Transactional mode**: a [`Tx`] is a turn of the writer: inside its current
//!   batch the writer opens a savepoint and lends the handler its connection; the
//!   layer runs the fenced completion on it, and the connection goes back with the
//!   savepoint released (or rolled back), and commits with the batch. Many
//!   handlers' transactions and many claims share one `fsync`.
//! - **Reads** (`get`, the claim's first read) run on the pool, in WAL mode beside
//!   the writer, and see committed writes only.
//! - **Expiry**: every statement treats a record past `expires_at` as absent.
//!   [`SqliteStore::purge_expired`] deletes them in bounded batches;
//!   [`SqliteStore::spawn_purge`] runs it periodically.
//! - **Wait mode**: waiters are woken in process by completions, releases and deletes
//!   through this store (transactional commits included); other processes poll.
//!
//! # Errors
//!
//! Classified by `sqlx` error variant and SQLite result code, never by message text:
//! `SQLITE_BUSY` and `SQLITE_LOCKED` (the busy timeout passed), I/O errors, a full
//! disk, a file that cannot be opened, pool timeouts and a closed pool are
//! [`StoreError::Unavailable`](idemgate_core::StoreError::Unavailable) (the layer's
//! 503); an undecodable row or a corrupt file is
//! [`StoreError::Corrupt`](idemgate_core::StoreError::Corrupt). A table the file does
//! not have (plain `SQLITE_ERROR`: SQLite gives "no such table" no code of its own,
//! and the store's statements are fixed) and a file or process that may not write
//! (`SQLITE_READONLY`, `SQLITE_PERM`, `SQLITE_AUTH`) are
//! [`StoreError::Misconfigured`](idemgate_core::StoreError::Misconfigured): the
//! layer's 500 `store-misconfigured`, logged with the fix (run `migrate()`).
//! Anything else is logged and answered as `Unavailable`, so the layer fails closed.
//!
//! # Transactional mode
//!
//! Business writes made through [`Tx`] commit in the same transaction as the record's
//! completion; the claim itself commits before the handler runs, so the operation id
//! survives a crash. Key the business row by the operation id the handler is given
//! (the layer puts it in the request extensions), in a `UNIQUE` column.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idemgate_core::record::OperationId;
//! use idemgate_sqlite::{SqliteStore, Tx};
//!
//! // CREATE TABLE orders (
//! //     id           INTEGER PRIMARY KEY,
//! //     operation_id BLOB NOT NULL UNIQUE,
//! //     amount       INTEGER NOT NULL
//! // );
//!
//! /// The part of the handler that writes; `operation_id` is the one the layer gives
//! /// the handler for this request.
//! async fn create_order(
//!     tx: &mut Tx,
//!     operation_id: OperationId,
//!     amount: i64,
//! ) -> Result<i64, sqlx::Error> {
//!     sqlx::query_scalar("INSERT INTO orders (operation_id, amount) VALUES (?1, ?2) RETURNING id")
//!         .bind(operation_id.as_bytes().to_vec())
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
//! # fn app(store: SqliteStore) -> Router {
//! // The state provides the store (`FromRef`); the route sits behind IdempotencyLayer.
//! Router::new().route("/orders", post(handler)).with_state(store)
//! # }
//! ```
//!
//! A `Tx` holds the store's one writer connection (and SQLite's write lock) until the
//! layer finishes the request (see [`Tx`]), so transactional handlers should be
//! short; its commit is shared with the writes batched around it. Outside axum,
//! [`Tx::begin`] does what the extractor does.

mod audit;
mod durations;
mod error;
mod migrate;
mod pieces;
mod sql;
mod store;
mod tx;
mod writer;

pub use error::{Error, is_busy};
pub use idemgate_sqlx::{
    PROBLEM_ALREADY_LENT, PROBLEM_NOT_BEHIND_LAYER, PROBLEM_UNAVAILABLE, PurgeTask, TxRejection,
};
pub use sql::SCHEMA_VERSION;
pub use store::{DEFAULT_BUSY_TIMEOUT, SqliteStore};
pub use tx::Tx;
pub use writer::{WriterStats, WriterTransaction};
