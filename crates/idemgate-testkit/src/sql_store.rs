//! What every SQL store does with its table, whatever its dialect, as plain async
//! functions: migrations and their version tracking, corrupt rows, the readable
//! identity stored beside the digest, a database it cannot reach. The SQL stores'
//! test files held these twice, once per backend; [`crate::sql_store_conformance!`]
//! instantiates all of them for one store (feature `sql`).
//!
//! A store's tests describe their database once, in a [`SqlHarness`]: how to open
//! a store on a test database of its own (a PostgreSQL schema, an SQLite file), and
//! the few statements the suite cannot write portably (reading a schema version,
//! corrupting a row). The transactional suite builds on the same harness
//! ([`crate::transactional::TransactionalHarness`]). Each scenario gets a fresh
//! harness, so it can count every record in its database, and ends by calling
//! [`SqlHarness::finish`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idemgate_core::audit::{AuditEvent, AuditQuery, ExpiryJournal, Verifier, key_digest};
use idemgate_core::fingerprint::FieldDigests;
use idemgate_core::record::{FencingToken, OperationId};
use idemgate_core::resource_lease::{LeaseAcquisition, ResourceId};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::time::Timestamp;
use idemgate_core::transaction::TransactionSlot;
use idemgate_core::{Completion, FencedWrite, Lease, LeaseOrigin, Store, StoreError};
use idemgate_sqlx::{PurgeTask, SetupError, SqlStore, Tx, TxRejection};

use crate::fixtures::{DAY, acquire, awkward_response, claim_with_ttl, completion, fresh_request};

/// The record table every store migrates unless told otherwise.
pub const DEFAULT_TABLE: &str = "idemgate_records";

/// One SQL store's test database, as the SQL suites need it.
///
/// A harness is made fresh for every scenario and owns a database no other test
/// uses (a PostgreSQL schema, an SQLite file). The methods that only forward to the
/// store (`migrate`, `with_table`, the purge) are here because the stores have them
/// as inherent methods, not on [`SqlStore`].
#[async_trait]
pub trait SqlHarness: Send + Sync + 'static {
    /// The store under test.
    type Store: SqlStore;

    /// The schema version the store's `migrate()` records: its crate's
    /// `SCHEMA_VERSION` (the stores add versions of their own, so the number is
    /// each store's).
    const SCHEMA_VERSION: i64;

    /// A store on a new pool of `max_connections` over this harness's database, as
    /// the store's `new(pool)` makes it: nothing created, nothing migrated.
    async fn unmigrated(&self, max_connections: u32) -> Self::Store;

    /// A store on a new pool of `max_connections` over this harness's database,
    /// migrated (for a [`TransactionalHarness`](crate::transactional::TransactionalHarness),
    /// with the orders table in place too). Two calls give two instances of a
    /// service sharing one database.
    async fn store(&self, max_connections: u32) -> Self::Store;

    /// A store as a restarted instance opens it, once every earlier pool is closed.
    async fn reopen(&self) -> Self::Store {
        self.store(2).await
    }

    /// A store whose database cannot be reached (a closed port, a file that cannot
    /// be opened), on a pool that gives up on a connection within 500 ms.
    fn unreachable(&self) -> Self::Store;

    /// The store's `migrate()`.
    async fn migrate(&self, store: &Self::Store) -> Result<(), SetupError>;

    /// The store's `with_table(table)`: its records in another table of the same
    /// database.
    fn with_table(&self, store: &Self::Store, table: &str) -> Self::Store;

    /// The schema version `idemgate_schema_versions` records for `table`, if any.
    async fn schema_version(&self, store: &Self::Store, table: &str) -> Option<i64>;

    /// Records `version` as `table`'s schema version, as a newer build's migration
    /// would.
    async fn set_schema_version(&self, store: &Self::Store, table: &str, version: i64);

    /// Whether sqlx's own migration table (`_sqlx_migrations`) exists where the
    /// store keeps its tables.
    async fn has_sqlx_migrations(&self, store: &Self::Store) -> bool;

    /// How many idempotency records there are in the store's table, expired or not.
    async fn records(&self, store: &Self::Store) -> i64;

    /// The readable parts of the identity stored beside `identity`'s digest.
    async fn stored_identity(
        &self,
        store: &Self::Store,
        identity: &IdentityDigest,
    ) -> StoredIdentity;

    /// Overwrites the stored response headers of `identity`'s record with bytes
    /// that do not decode.
    async fn corrupt_headers(&self, store: &Self::Store, identity: &IdentityDigest);

    /// The store's `purge_expired(batch)`.
    async fn purge_expired(&self, store: &Self::Store, batch: usize) -> Result<u64, StoreError>;

    /// The store's `spawn_purge(every, batch)`, on the current runtime.
    fn spawn_purge(&self, store: &Self::Store, every: Duration, batch: usize) -> PurgeTask;

    /// Removes this harness's database (what `Drop` cannot do asynchronously).
    async fn finish(&self) {}
}

/// The readable columns a record keeps beside its identity digest, for operators
/// reading the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredIdentity {
    /// The principal's name.
    pub principal: String,
    /// The request method.
    pub method: String,
    /// The request path.
    pub path: String,
    /// The idempotency key.
    pub key: String,
}

/// Instantiates every test of [`crate::sql_store`] for one SQL store, as
/// `#[tokio::test]`s on a multi-threaded runtime. `$factory` is an async fn returning
/// a fresh [`SqlHarness`]; it is called once per test.
///
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) among its
/// dev-dependencies.
#[macro_export]
macro_rules! sql_store_conformance {
    ($factory:path) => {
        $crate::sql_store_conformance!(@tests $factory;
            concurrent_migrations_and_version_tracking,
            version_1_migrates_forward,
            undecodable_record_is_corrupt,
            readable_identity_parts_are_stored,
            unreachable_database_is_unavailable,
            a_journalled_purge_records_each_expiry,
            two_instances_append_to_one_partition_in_turn,
        );
    };
    (@tests $factory:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::sql_store::$name(::std::sync::Arc::new($factory().await)).await;
            }
        )*
    };
}

/// A table a build before resource leases migrated (version 1) is taken to the
/// current version by `migrate()` (every later step, each one safe to run again
/// over what is already there), and its resource leases and the records' field
/// digests then work.
pub async fn version_1_migrates_forward<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    harness.set_schema_version(&store, DEFAULT_TABLE, 1).await;
    harness
        .migrate(&store)
        .await
        .expect("migrate from version 1");
    assert_eq!(
        harness.schema_version(&store, DEFAULT_TABLE).await,
        Some(H::SCHEMA_VERSION)
    );
    let resource = ResourceId::new(&format!("migrated/{}", uuid::Uuid::new_v4()));
    let LeaseAcquisition::Acquired(lease) = store
        .acquire_resource_lease(&resource, DAY)
        .await
        .expect("acquire after the migration")
    else {
        panic!("a fresh resource is free");
    };
    assert_eq!(
        store.release_resource_lease(&lease).await.expect("release"),
        FencedWrite::Applied
    );
    let mut request = fresh_request();
    let key = *request.identity.digest().as_bytes();
    request.field_digests = FieldDigests::of_json(br#"{"amount":1}"#, &key);
    acquire(&store, &request).await;
    let read = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record present");
    assert_eq!(read.record.field_digests, request.field_digests);
    harness.finish().await;
}

/// Eight instances migrate one fresh database at once (over two pools): all
/// succeed, the version is recorded in `idemgate_schema_versions` (never in sqlx's
/// `_sqlx_migrations`), a custom table keeps its own version row and works, and a
/// table a newer build migrated is refused with [`SetupError::SchemaTooNew`].
pub async fn concurrent_migrations_and_version_tracking<H: SqlHarness>(harness: Arc<H>) {
    let pools = [harness.unmigrated(4).await, harness.unmigrated(4).await];
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (harness, store) = (Arc::clone(&harness), pools[i % 2].clone());
            tokio::spawn(async move { harness.migrate(&store).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("concurrent migrate");
    }
    let store = &pools[0];
    assert_eq!(
        harness.schema_version(store, DEFAULT_TABLE).await,
        Some(H::SCHEMA_VERSION)
    );
    assert!(
        !harness.has_sqlx_migrations(store).await,
        "the store must not use sqlx's migration table"
    );

    // A custom table (a name that needs quoting) keeps its own version row.
    let custom_table = "payments-keys v1";
    let custom = harness.with_table(store, custom_table);
    harness
        .migrate(&custom)
        .await
        .expect("migrate custom table");
    claim_with_ttl(&custom, DAY).await;
    assert_eq!(harness.records(&custom).await, 1);
    assert_eq!(
        harness.schema_version(store, custom_table).await,
        Some(H::SCHEMA_VERSION)
    );

    harness.set_schema_version(store, DEFAULT_TABLE, 99).await;
    let err = harness.migrate(store).await.expect_err("newer schema");
    assert!(
        matches!(
            err,
            SetupError::SchemaTooNew {
                found: 99,
                supported
            } if supported == H::SCHEMA_VERSION
        ),
        "{err:?}"
    );
    harness.finish().await;
}

/// A record that cannot be decoded is `Corrupt`, not a panic, for a read and for a
/// claim.
pub async fn undecodable_record_is_corrupt<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let write = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    harness.corrupt_headers(&store, &lease.identity).await;
    let err = store
        .get(request.identity.digest())
        .await
        .expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    let err = store.try_claim(&request).await.expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    harness.finish().await;
}

/// The record's readable parts (principal, method, path, key) are stored beside
/// the digest, as the request had them.
pub async fn readable_identity_parts_are_stored<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    let request = fresh_request();
    acquire(&store, &request).await;
    let scope = request.identity.scope();
    assert_eq!(
        harness
            .stored_identity(&store, request.identity.digest())
            .await,
        StoredIdentity {
            principal: scope.principal.as_str().to_owned(),
            method: "POST".to_owned(),
            path: "/orders".to_owned(),
            key: request.identity.key().as_str().to_owned(),
        }
    );
    harness.finish().await;
}

/// A database the store cannot reach: every method (and a transactional
/// `Tx::begin`) answers `Unavailable`, quickly. A closed pool too.
pub async fn unreachable_database_is_unavailable<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.unreachable();
    let request = fresh_request();
    let start = Instant::now();
    let err = store.try_claim(&request).await.expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = store
        .get(request.identity.digest())
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let lease = Lease {
        identity: *request.identity.digest(),
        operation_id: OperationId::generate(),
        token: FencingToken(1),
        origin: LeaseOrigin::New,
        locked_until: Timestamp::now(),
    };
    let err = store
        .complete(&lease, &completion(awkward_response()))
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = harness
        .purge_expired(&store, 10)
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let slot = TransactionSlot::new();
    let err = Tx::begin(&store, &slot).await.expect_err("unreachable");
    assert!(matches!(err, TxRejection::Unavailable(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );

    let store = harness.store(2).await;
    store.pool().close().await;
    let err = store.try_claim(&request).await.expect_err("closed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    harness.finish().await;
}

/// With the journal on (`Store::journal_expiries`), a purge journals each
/// record it deletes as `expired` — the record's method, path, principal,
/// operation id, fingerprint, status and the key's digest, never the key — in
/// the purge's own transaction, chained like every other entry; a record still
/// live is neither deleted nor journalled.
pub async fn a_journalled_purge_records_each_expiry<H: SqlHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    let secret = store.audit_secret().await.expect("audit_secret");
    let instance = format!("purge-{}", uuid::Uuid::new_v4());
    store.journal_expiries(ExpiryJournal {
        instance: instance.clone(),
        secret: secret.clone(),
    });
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let short = Completion {
        ttl: Duration::from_millis(1),
        ..completion(awkward_response())
    };
    assert_eq!(
        store.complete(&lease, &short).await.expect("complete"),
        FencedWrite::Applied
    );
    let live = claim_with_ttl(&store, DAY).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(harness.purge_expired(&store, 10).await.expect("purge"), 1);
    assert!(
        store
            .get(request.identity.digest())
            .await
            .expect("get")
            .is_none(),
        "the expired record went"
    );
    assert!(
        store.get(&live.identity).await.expect("get").is_some(),
        "a live record stays"
    );

    let entries: Vec<_> = store
        .read_audit(&AuditQuery::all(10_000))
        .await
        .expect("read_audit")
        .into_iter()
        .filter(|e| e.record.instance == instance)
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one entry per expired record: {entries:?}"
    );
    let entry = &entries[0].record;
    assert_eq!(entry.event(), AuditEvent::Expired);
    assert_eq!(entry.operation_id, Some(lease.operation_id.to_string()));
    assert_eq!(entry.method, "POST");
    assert_eq!(entry.route, "/orders");
    assert_eq!(entry.principal, request.identity.scope().principal.as_str());
    assert_eq!(
        entry.key_digest,
        key_digest(&secret, request.identity.key().as_str()),
        "the key's digest, never the key"
    );
    assert_eq!(
        entry.fingerprint.as_deref(),
        Some(
            request
                .fingerprint
                .as_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .as_str()
        )
    );
    assert_eq!(entry.status, Some(awkward_response().status.as_u16()));
    let partitions: Vec<_> = store
        .audit_partitions()
        .await
        .expect("audit_partitions")
        .into_iter()
        .filter(|p| p.instance == instance)
        .collect();
    let mut verifier = Verifier::new(&partitions);
    verifier.push(&entries[0]).expect("chained");
    verifier.finish().expect("the chain verifies");
    harness.finish().await;
}

/// Two store instances on one database (two processes with one instance
/// name, or an instance restarted beside its old self) append to one
/// partition in turn: each append links to the entry the other just wrote,
/// whatever either remembers of the head, and the chain verifies whole
/// ([`crate::conformance::audit_appenders_of_one_instance_keep_one_chain`]).
pub async fn two_instances_append_to_one_partition_in_turn<H: SqlHarness>(harness: Arc<H>) {
    crate::conformance::audit_appenders_of_one_instance_keep_one_chain(
        Arc::new(harness.store(2).await),
        Arc::new(harness.store(2).await),
    )
    .await;
}

/// For a store that writes a claim's journal entry with the claim
/// ([`Store::try_claim_journaled`] answering `true`: SQLite, in the claim's
/// batch of its writer): once the claim returns, the journal holds exactly
/// the template made `claimed` — then `taken_over`, when the lease lapsed and
/// the key is claimed again — with the record's operation id, and its
/// partition (the template's instance) verifies. A claim that meets the held
/// record writes nothing.
pub async fn a_journaled_claim_writes_its_entry_with_it<H: SqlHarness>(harness: Arc<H>) {
    use crate::conformance::{audit_of, verify_partition};
    use idemgate_core::audit::{AuditEntry, AuditRecord};
    use idemgate_core::{Claim, ClaimRequest};

    let store = harness.store(4).await;
    let instance = format!("journaled-{}", uuid::Uuid::new_v4().simple());
    let template = AuditRecord {
        event: None,
        operation_id: None,
        method: "POST".into(),
        route: "/orders/{id}".into(),
        principal: "tenant:7/user:42".into(),
        key_digest: "ab".repeat(32),
        fingerprint: Some("cd".repeat(32)),
        status: None,
        duration_ms: None,
        instance: instance.clone(),
    };
    let claim = |request: ClaimRequest| {
        let (store, template) = (&store, &template);
        async move {
            store
                .try_claim_journaled(&request, template)
                .await
                .expect("try_claim_journaled")
        }
    };
    // The journal's entries of one operation.
    let entries_of = |operation: OperationId| {
        let store = &store;
        async move {
            let entries: Vec<AuditEntry> = store
                .read_audit(&AuditQuery::all(100_000))
                .await
                .expect("read_audit")
                .into_iter()
                .filter(|e| e.record.operation_id == Some(operation.to_string()))
                .collect();
            entries
        }
    };
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let (Claim::Acquired(first), written) = claim(request.clone()).await else {
        panic!("a fresh key is claimed");
    };
    assert!(written, "the store wrote the claim's entry with it");
    let (again, written) = claim(request.clone()).await;
    assert!(matches!(again, Claim::Existing(_)), "a live lease is held");
    assert!(!written, "meeting a held record writes no entry");

    tokio::time::sleep(Duration::from_millis(400)).await;
    let (Claim::Acquired(second), written) = claim(ClaimRequest {
        lease: DAY,
        ..request
    })
    .await
    else {
        panic!("a lapsed lease is taken over");
    };
    assert_eq!(second.origin, LeaseOrigin::TakenOver);
    assert!(written, "the takeover's entry was written with it");

    let entries = entries_of(first.operation_id).await;
    let events: Vec<AuditEvent> = entries.iter().map(|e| e.record.event()).collect();
    assert_eq!(
        events,
        [AuditEvent::Claimed, AuditEvent::TakenOver],
        "one entry per acquired claim, in order"
    );
    for entry in &entries {
        let expected = AuditRecord {
            event: Some(entry.record.event()),
            operation_id: Some(first.operation_id.to_string()),
            ..template.clone()
        };
        assert_eq!(
            entry.record, expected,
            "the template, made the claim's entry"
        );
    }
    let partition = audit_of(&store, &instance).await;
    assert_eq!(
        partition, entries,
        "the instance's partition holds just them"
    );
    assert_eq!(
        verify_partition(&store, &instance, &partition).await,
        2,
        "the claims' partition verifies"
    );
    harness.finish().await;
}
