//! The transactional-mode suite: what every SQL store's [`Tx`] must do, as plain
//! async functions. [`crate::transactional_conformance!`] instantiates all of them
//! for one store.
//!
//! A store's tests describe its database once, in a [`TransactionalHarness`]: the
//! [`SqlHarness`] the other SQL suite uses too (how to open a store on a test
//! database of its own: a schema, a file), plus how to write one business row (an
//! "order", keyed by a `UNIQUE` operation id) through a [`Tx`] and how to count
//! orders. Each scenario gets a fresh harness, so it can count every order and every
//! record in its database, and ends by calling [`SqlHarness::finish`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use idemgate_core::record::{OperationId, RecordStatus, StoredBody, StoredResponse};
use idemgate_core::transaction::{
    ClaimInTransaction, PendingTransaction, SlotContents, TransactionSlot,
};
use idemgate_core::{Claim, ClaimRequest, Decision, FencedWrite, LeaseOrigin, Store, decide};
use idemgate_sqlx::{PROBLEM_NOT_BEHIND_LAYER, SqlStore, Tx};
use tokio::sync::Barrier;
use tower::ServiceExt;

use crate::fixtures::{DAY, acquire, awkward_response, claim_with_ttl, completion, fresh_request};
use crate::http::{Answer, PROBLEM_JSON};
use crate::sql_store::SqlHarness;

/// One SQL store's test database with an orders table beside the records, as the
/// transactional suite needs it: `operation_id` in a `UNIQUE` column, so one
/// operation can write one order. [`SqlHarness::store`] gives a store with that
/// table in place.
#[async_trait]
pub trait TransactionalHarness: SqlHarness {
    /// Inserts one order for `operation_id` through `tx`; fails (without panicking)
    /// when that operation already has an order.
    async fn insert_order(
        &self,
        tx: &mut Tx<Self::Store>,
        operation_id: OperationId,
    ) -> Result<(), sqlx::Error>;

    /// How many committed orders `operation_id` has.
    async fn orders_for(&self, store: &Self::Store, operation_id: OperationId) -> i64;

    /// How many committed orders there are in this harness's database.
    async fn orders(&self, store: &Self::Store) -> i64;
}

/// Instantiates every test of [`crate::transactional`] for one SQL store, as
/// `#[tokio::test]`s on a multi-threaded runtime. `$factory` is an async fn returning
/// a fresh [`TransactionalHarness`]; it is called once per test.
///
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) among its
/// dev-dependencies.
#[macro_export]
macro_rules! transactional_conformance {
    ($factory:path) => {
        $crate::transactional_conformance!(@tests $factory;
            rollback_leaves_no_order_and_release_reclaims_the_operation,
            abandoned_transaction_rolls_back_and_the_lapsed_lease_is_taken_over,
            stale_transactional_completion_is_refused_and_rolled_back,
            the_executed_entry_commits_with_the_business_write_or_not_at_all,
            concurrent_transactional_requests_on_two_instances_write_one_order,
            completed_records_survive_reopening,
            keyless_transactions_commit_or_roll_back,
            transactional_commit_wakes_waiters,
            extractor_lends_the_slot_transaction,
            extractor_without_the_layer_answers_a_problem,
            a_second_transaction_in_one_request_is_refused,
            purge_deletes_only_expired_records_in_batches,
            background_purge_runs_until_dropped,
            one_transaction_claim_commits_with_the_order_or_vanishes_with_it,
            one_transaction_crash_leaves_no_claim,
            one_transaction_duplicate_never_acquires_while_the_first_is_open,
            one_transaction_lock_wait_bounds_only_the_claim,
            an_offered_transaction_of_another_store_is_refused,
        );
    };
    (@tests $factory:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::transactional::$name(::std::sync::Arc::new($factory().await)).await;
            }
        )*
    };
}

fn returned(slot: &TransactionSlot) -> Box<dyn PendingTransaction> {
    match slot.take() {
        SlotContents::Returned(pending) => pending,
        SlotContents::Unused => panic!("the slot is unused"),
        SlotContents::StillLent => panic!("the transaction was not given back"),
    }
}

async fn begin<S: SqlStore>(store: &S, slot: &TransactionSlot) -> Tx<S> {
    Tx::begin(store, slot).await.expect("begin")
}

/// What a transactional handler does: takes a `Tx` from a fresh slot, writes the order
/// of `operation_id` through it and drops it. Returns the transaction the layer then
/// finishes.
async fn handler_writes_order<H: TransactionalHarness>(
    harness: &H,
    store: &H::Store,
    operation_id: OperationId,
) -> Box<dyn PendingTransaction> {
    writes_order_in(harness, store, TransactionSlot::new(), operation_id).await
}

/// The same through `slot`: with a transaction offered in it (the
/// one-transaction mode), the handler's `Tx` continues that one.
async fn writes_order_in<H: TransactionalHarness>(
    harness: &H,
    store: &H::Store,
    slot: TransactionSlot,
    operation_id: OperationId,
) -> Box<dyn PendingTransaction> {
    let mut tx = begin(store, &slot).await;
    harness
        .insert_order(&mut tx, operation_id)
        .await
        .expect("insert");
    drop(tx);
    returned(&slot)
}

/// (a) A failure after the business insert and before commit: the layer rolls back,
/// no order row remains, and the record can be released and reclaimed with the same
/// operation id; the retry then commits order and record together.
pub async fn rollback_leaves_no_order_and_release_reclaims_the_operation<
    H: TransactionalHarness,
>(
    harness: Arc<H>,
) {
    let store = harness.store(4).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;

    // The handler fails after its insert: a 5xx whose effects the rollback undoes.
    let pending = handler_writes_order(&*harness, &store, lease.operation_id).await;
    pending.rollback().await.expect("rollback");
    assert_eq!(
        harness.orders_for(&store, lease.operation_id).await,
        0,
        "rolled-back order is visible"
    );
    assert_eq!(
        store.release(&lease).await.expect("release"),
        FencedWrite::Applied
    );

    let retry = acquire(&store, &request).await;
    assert_eq!(retry.origin, LeaseOrigin::Released);
    assert_eq!(
        retry.operation_id, lease.operation_id,
        "a retry continues the same operation"
    );
    let write = handler_writes_order(&*harness, &store, retry.operation_id)
        .await
        .complete_and_commit(&retry, &completion(awkward_response()), &[])
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    assert_eq!(harness.orders_for(&store, retry.operation_id).await, 1);
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.status(), RecordStatus::Completed);
    assert_eq!(snapshot.record.response(), Some(&awkward_response()));
    harness.finish().await;
}

/// (a') The process dies between the business insert and the commit: the pending
/// transaction is simply dropped. Nothing is committed, and once the lease lapses the
/// next request takes the record over with the same operation id.
pub async fn abandoned_transaction_rolls_back_and_the_lapsed_lease_is_taken_over<
    H: TransactionalHarness,
>(
    harness: Arc<H>,
) {
    let store = harness.store(4).await;
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let lease = acquire(&store, &request).await;
    drop(handler_writes_order(&*harness, &store, lease.operation_id).await); // never committed
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(harness.orders_for(&store, lease.operation_id).await, 0);
    let takeover = acquire(
        &store,
        &ClaimRequest {
            lease: DAY,
            ..request
        },
    )
    .await;
    assert_eq!(takeover.origin, LeaseOrigin::TakenOver);
    assert_eq!(takeover.operation_id, lease.operation_id);
    assert_ne!(takeover.token, lease.token);
    harness.finish().await;
}

/// (c) A holder whose lease was taken over completes in its transaction: refused, and
/// its order row is rolled back with it; the new holder's commit goes through.
pub async fn stale_transactional_completion_is_refused_and_rolled_back<H: TransactionalHarness>(
    harness: Arc<H>,
) {
    let store = harness.store(4).await;
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let stale = acquire(&store, &request).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = acquire(
        &store,
        &ClaimRequest {
            lease: DAY,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(current.origin, LeaseOrigin::TakenOver);

    let write = handler_writes_order(&*harness, &store, stale.operation_id)
        .await
        .complete_and_commit(&stale, &completion(awkward_response()), &[])
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Refused);
    assert_eq!(
        harness.orders_for(&store, stale.operation_id).await,
        0,
        "a refused completion kept its order"
    );
    let snapshot = store
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.status(), RecordStatus::Processing);
    assert_eq!(snapshot.record.token, current.token);

    let write = handler_writes_order(&*harness, &store, current.operation_id)
        .await
        .complete_and_commit(&current, &completion(awkward_response()), &[])
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    assert_eq!(harness.orders_for(&store, current.operation_id).await, 1);
    harness.finish().await;
}

/// The journal's `executed` entry (issue 38) is appended in the business
/// transaction: committed with the order and the completion, chained after what
/// the instance journalled before; absent when the fence refuses the completion
/// (the order rolled back with it) — never an entry without its effect, never
/// an effect without its entry.
pub async fn the_executed_entry_commits_with_the_business_write_or_not_at_all<
    H: TransactionalHarness,
>(
    harness: Arc<H>,
) {
    use idemgate_core::audit::{AuditEvent, AuditQuery, AuditRecord, Verifier};

    let store = harness.store(4).await;
    let instance = format!("tx-{}", uuid::Uuid::new_v4().simple());
    let entry = |operation: OperationId, event: AuditEvent| AuditRecord {
        event: Some(event),
        operation_id: Some(operation.to_string()),
        method: "POST".into(),
        route: "/orders".into(),
        principal: "user:42".into(),
        key_digest: "digest".into(),
        status: Some(201),
        instance: instance.clone(),
        ..AuditRecord::default()
    };
    let ours = |entries: Vec<idemgate_core::audit::AuditEntry>| {
        entries
            .into_iter()
            .filter(|e| e.record.instance == instance)
            .map(|e| (e.record.event(), e.record.operation_id))
            .collect::<Vec<_>>()
    };

    // Refused: a holder whose lease was taken over; its entry goes with its order.
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let stale = acquire(&store, &request).await;
    store
        .append_audit(&[entry(stale.operation_id, AuditEvent::Claimed)])
        .await
        .expect("append");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = acquire(
        &store,
        &ClaimRequest {
            lease: DAY,
            ..request.clone()
        },
    )
    .await;
    let executed = entry(stale.operation_id, AuditEvent::Executed);
    let write = handler_writes_order(&*harness, &store, stale.operation_id)
        .await
        .complete_and_commit(
            &stale,
            &completion(awkward_response()),
            std::slice::from_ref(&executed),
        )
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Refused);
    assert_eq!(harness.orders_for(&store, stale.operation_id).await, 0);

    // Applied: the order, the completion and the entry, one commit.
    let executed = entry(current.operation_id, AuditEvent::Executed);
    let write = handler_writes_order(&*harness, &store, current.operation_id)
        .await
        .complete_and_commit(
            &current,
            &completion(awkward_response()),
            std::slice::from_ref(&executed),
        )
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    assert_eq!(harness.orders_for(&store, current.operation_id).await, 1);

    let all = store
        .read_audit(&AuditQuery::all(100_000))
        .await
        .expect("read the journal");
    let operation = Some(current.operation_id.to_string());
    assert_eq!(
        ours(all.clone()),
        [
            (AuditEvent::Claimed, operation.clone()),
            (AuditEvent::Executed, operation),
        ],
        "the refused completion left no entry, the applied one exactly one"
    );
    // Chained after the instance's earlier entry, as the journal writer's are.
    let partitions = store.audit_partitions().await.expect("partitions");
    let mut verifier = Verifier::new(&partitions);
    for entry in &all {
        verifier.push(entry).expect("the chain holds");
    }
    verifier.finish().expect("the chain ends at the heads");
    harness.finish().await;
}

#[derive(Debug)]
enum Outcome {
    Executed,
    Replayed(StoredResponse),
}

/// One "request" as the layer would run it, with a transactional handler that writes
/// one order. The first holder is slow, so its lease lapses and another request takes
/// the operation over while it still runs.
async fn transactional_request<H: TransactionalHarness>(
    harness: Arc<H>,
    store: H::Store,
    request: Arc<ClaimRequest>,
    refused: Arc<AtomicUsize>,
) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match store.try_claim(&request).await.expect("claim") {
            Claim::Acquired(lease) => {
                let slot = TransactionSlot::new();
                let mut tx = begin(&store, &slot).await;
                let inserted = harness.insert_order(&mut tx, lease.operation_id).await;
                if lease.origin == LeaseOrigin::New {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
                drop(tx);
                let pending = returned(&slot);
                if inserted.is_err() {
                    pending.rollback().await.expect("rollback");
                    let _ = store.release(&lease).await.expect("release");
                    continue;
                }
                let body = StoredResponse {
                    trailers: Vec::new(),
                    body: StoredBody::Retained(Bytes::from(lease.operation_id.to_string())),
                    ..awkward_response()
                };
                match pending
                    .complete_and_commit(&lease, &completion(body), &[])
                    .await
                    .expect("complete")
                {
                    FencedWrite::Applied => return Outcome::Executed,
                    FencedWrite::Refused => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Claim::Existing(snapshot) => match decide(&snapshot, &request.fingerprint) {
                Decision::Replay(response) => return Outcome::Replayed(response.clone()),
                Decision::InProgress { .. } => tokio::time::sleep(Duration::from_millis(20)).await,
                Decision::Claimable => {}
                Decision::Mismatch => panic!("same request, other fingerprint"),
            },
        }
    }
    panic!("a request neither executed nor replayed within 20 s");
}

/// (b) 64 concurrent requests with one key over two pools on one database ("two
/// instances"): exactly one order row, one COMPLETED record, one executed response
/// that all others replay.
pub async fn concurrent_transactional_requests_on_two_instances_write_one_order<
    H: TransactionalHarness,
>(
    harness: Arc<H>,
) {
    const REQUESTS: usize = 64;
    let instances = [harness.store(8).await, harness.store(8).await];
    let request = Arc::new(ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    });
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let refused = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let store = instances[i % 2].clone();
            let (harness, request, barrier, refused) = (
                Arc::clone(&harness),
                Arc::clone(&request),
                Arc::clone(&barrier),
                Arc::clone(&refused),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                transactional_request(harness, store, request, refused).await
            })
        })
        .collect();
    let mut executed = 0;
    let mut replays = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            Outcome::Executed => executed += 1,
            Outcome::Replayed(response) => replays.push(response),
        }
    }
    assert_eq!(
        executed, 1,
        "{executed} of {REQUESTS} requests executed; exactly one may"
    );
    let snapshot = instances[0]
        .get(request.identity.digest())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(snapshot.record.status(), RecordStatus::Completed);
    let operation_id = snapshot.record.operation_id;
    assert_eq!(
        harness.orders_for(&instances[0], operation_id).await,
        1,
        "one operation must write exactly one order"
    );
    assert_eq!(harness.orders(&instances[1]).await, 1);
    let stored = snapshot.record.response().expect("stored response");
    assert_eq!(
        stored.body,
        StoredBody::Retained(Bytes::from(operation_id.to_string()))
    );
    assert!(
        replays.iter().all(|r| r == stored),
        "a replay differs from the stored response"
    );
    eprintln!(
        "{} refused transactional completion(s) rolled back",
        refused.load(Ordering::Relaxed)
    );
    harness.finish().await;
}

/// (d) Durability: complete, close the pool, reopen (a restarted instance): the
/// replayed response is identical and the one order is there.
pub async fn completed_records_survive_reopening<H: TransactionalHarness>(harness: Arc<H>) {
    let request = fresh_request();
    let operation_id = {
        let store = harness.store(2).await;
        let lease = acquire(&store, &request).await;
        let write = handler_writes_order(&*harness, &store, lease.operation_id)
            .await
            .complete_and_commit(&lease, &completion(awkward_response()), &[])
            .await
            .expect("complete");
        assert_eq!(write, FencedWrite::Applied);
        store.pool().close().await;
        lease.operation_id
    };

    let store = harness.reopen().await;
    match store.try_claim(&request).await.expect("claim") {
        Claim::Existing(snapshot) => {
            assert_eq!(snapshot.record.status(), RecordStatus::Completed);
            assert_eq!(snapshot.record.operation_id, operation_id);
            assert_eq!(snapshot.record.response(), Some(&awkward_response()));
        }
        Claim::Acquired(lease) => panic!("a completed record was lost: acquired {lease:?}"),
    }
    assert_eq!(harness.orders_for(&store, operation_id).await, 1);
    harness.finish().await;
}

/// Keyless requests: `commit` keeps the business writes, `rollback` drops them.
pub async fn keyless_transactions_commit_or_roll_back<H: TransactionalHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    for commit in [true, false] {
        let operation_id = OperationId::generate();
        let pending = handler_writes_order(&*harness, &store, operation_id).await;
        if commit {
            pending.commit().await.expect("commit");
        } else {
            pending.rollback().await.expect("rollback");
        }
        assert_eq!(
            harness.orders_for(&store, operation_id).await,
            i64::from(commit)
        );
    }
    harness.finish().await;
}

/// A transactional completion wakes a waiter on the same instance at once.
pub async fn transactional_commit_wakes_waiters<H: TransactionalHarness>(harness: Arc<H>) {
    let store = harness.store(4).await;
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let digest = *request.identity.digest();
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            store
                .wait_for_change(&digest, Duration::from_secs(10))
                .await;
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slot = TransactionSlot::new();
    drop(begin(&store, &slot).await);
    let write = returned(&slot)
        .complete_and_commit(&lease, &completion(awkward_response()), &[])
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    let waited = waiter.await.expect("waiter");
    assert!(
        waited < Duration::from_secs(5),
        "woke only after {waited:?}"
    );
    harness.finish().await;
}

// --- the one-transaction mode (PROTOCOL §23) -------------------------------------------

/// Claims `request` in a new transaction, which must acquire it.
async fn acquire_in_transaction<S: SqlStore>(
    store: &S,
    request: &ClaimRequest,
    lock_wait: Duration,
) -> (idemgate_core::Lease, Box<dyn PendingTransaction>) {
    match store
        .claim_in_transaction(request, lock_wait)
        .await
        .expect("claim in a transaction")
    {
        ClaimInTransaction::Acquired { lease, transaction } => (lease, transaction),
        other => panic!("expected to acquire, found {other:?}"),
    }
}

/// What a handler does with the claim's transaction: its `Tx` continues the
/// offered one, writes the order and gives it back.
async fn order_in_offered<H: TransactionalHarness>(
    harness: &H,
    store: &H::Store,
    transaction: Box<dyn PendingTransaction>,
    operation_id: OperationId,
) -> Box<dyn PendingTransaction> {
    let slot = TransactionSlot::new();
    slot.offer(transaction);
    writes_order_in(harness, store, slot, operation_id).await
}

/// The claim is the first statement of the handler's transaction: invisible to
/// every other connection until the completion commits with the order; a
/// rollback takes claim and order away (no record, no order, the key new
/// again); a commit leaves the completed record and one order, which the next
/// claim in a transaction finds and replays.
pub async fn one_transaction_claim_commits_with_the_order_or_vanishes_with_it<
    H: TransactionalHarness,
>(
    harness: Arc<H>,
) {
    let store = harness.store(4).await;
    assert!(store.supports_one_transaction());
    let request = fresh_request();
    let identity = request.identity.digest();

    let (lease, transaction) = acquire_in_transaction(&store, &request, DAY).await;
    assert_eq!(lease.origin, LeaseOrigin::New);
    let pending = order_in_offered(&*harness, &store, transaction, lease.operation_id).await;
    assert!(
        store.get(identity).await.expect("get").is_none(),
        "an uncommitted claim is visible to another connection"
    );
    pending.rollback().await.expect("rollback");
    store.rolled_back_in_transaction(&lease);
    assert!(
        store.get(identity).await.expect("get").is_none(),
        "a rolled-back claim left a record"
    );
    assert_eq!(harness.orders_for(&store, lease.operation_id).await, 0);

    let (retry, transaction) = acquire_in_transaction(&store, &request, DAY).await;
    assert_eq!(
        retry.origin,
        LeaseOrigin::New,
        "nothing of the rolled-back run remains"
    );
    let write = order_in_offered(&*harness, &store, transaction, retry.operation_id)
        .await
        .complete_and_commit(&retry, &completion(awkward_response()), &[])
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    assert_eq!(harness.orders_for(&store, retry.operation_id).await, 1);
    assert_eq!(harness.orders(&store).await, 1);

    match store
        .claim_in_transaction(&request, DAY)
        .await
        .expect("claim again")
    {
        ClaimInTransaction::Existing(snapshot) => {
            assert_eq!(snapshot.record.status(), RecordStatus::Completed);
            assert_eq!(snapshot.record.operation_id, retry.operation_id);
            assert_eq!(snapshot.record.response(), Some(&awkward_response()));
        }
        other => panic!("a completed record must be found, not {other:?}"),
    }
    harness.finish().await;
}

/// A process that dies inside the handler drops the transaction: the claim
/// was never committed, so no record is left to wait out — the retry claims
/// a new operation at once, with no lease to lapse.
pub async fn one_transaction_crash_leaves_no_claim<H: TransactionalHarness>(harness: Arc<H>) {
    let store = harness.store(4).await;
    let request = fresh_request();
    let (lease, transaction) = acquire_in_transaction(&store, &request, DAY).await;
    drop(order_in_offered(&*harness, &store, transaction, lease.operation_id).await);
    let retry = acquire(&store, &request).await;
    assert_eq!(
        retry.origin,
        LeaseOrigin::New,
        "a crashed claim left a record"
    );
    assert_eq!(
        harness.orders(&store).await,
        0,
        "a crashed run left its order"
    );
    harness.finish().await;
}

/// While the first claim's transaction is open, a second claim of the key on
/// another pool ("another instance") never acquires it: it waits (on
/// PostgreSQL's unique index, bounded by its lock wait, then `Locked`; for
/// SQLite's one writer, then finds the committed record). Either way one
/// order.
pub async fn one_transaction_duplicate_never_acquires_while_the_first_is_open<
    H: TransactionalHarness,
>(
    harness: Arc<H>,
) {
    let first_store = harness.store(4).await;
    let second_store = harness.store(4).await;
    let request = Arc::new(fresh_request());
    let (lease, transaction) = acquire_in_transaction(&first_store, &request, DAY).await;
    let pending = order_in_offered(&*harness, &first_store, transaction, lease.operation_id).await;

    let duplicate = tokio::spawn({
        let request = Arc::clone(&request);
        async move {
            second_store
                .claim_in_transaction(&request, Duration::from_millis(100))
                .await
                .expect("the duplicate's claim")
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let write = pending
        .complete_and_commit(&lease, &completion(awkward_response()), &[])
        .await
        .expect("complete");
    assert_eq!(write, FencedWrite::Applied);
    match duplicate.await.expect("task") {
        ClaimInTransaction::Locked => {}
        ClaimInTransaction::Existing(snapshot) => {
            assert_eq!(snapshot.record.status(), RecordStatus::Completed);
            assert_eq!(snapshot.record.operation_id, lease.operation_id);
        }
        ClaimInTransaction::Acquired { lease: second, .. } => panic!(
            "a duplicate acquired {:?} while the first claim's transaction was open",
            second.operation_id
        ),
    }
    assert_eq!(harness.orders(&first_store).await, 1);
    harness.finish().await;
}

/// The claim's short wait for another transaction's claim does not bound the
/// handler's own statements: an insert that waits 200 ms for another
/// transaction's row still succeeds, although the claim waited at most 1 ms.
pub async fn one_transaction_lock_wait_bounds_only_the_claim<H: TransactionalHarness>(
    harness: Arc<H>,
) {
    let store = harness.store(4).await;
    let operation_id = OperationId::generate();
    // Another transaction holds the order row the handler will write.
    let holder = handler_writes_order(&*harness, &store, operation_id).await;
    let handler = tokio::spawn({
        let (harness, store) = (Arc::clone(&harness), store.clone());
        async move {
            let request = fresh_request();
            let (lease, transaction) =
                acquire_in_transaction(&store, &request, Duration::from_millis(1)).await;
            let slot = TransactionSlot::new();
            slot.offer(transaction);
            let mut tx = begin(&store, &slot).await;
            let inserted = harness.insert_order(&mut tx, operation_id).await;
            drop(tx);
            let pending = returned(&slot);
            inserted.expect("the handler's insert, once the other transaction rolled back");
            pending
                .complete_and_commit(&lease, &completion(awkward_response()), &[])
                .await
                .expect("complete")
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.rollback().await.expect("rollback");
    assert_eq!(handler.await.expect("task"), FencedWrite::Applied);
    assert_eq!(harness.orders_for(&store, operation_id).await, 1);
    harness.finish().await;
}

/// A `Tx` offered another store's transaction (a handler naming another store
/// than the layer's) refuses with `OtherStore` rather than writing outside the
/// claim's transaction; the slot then reports a transaction never given back,
/// so the layer settles the run as rolled back.
pub async fn an_offered_transaction_of_another_store_is_refused<H: TransactionalHarness>(
    harness: Arc<H>,
) {
    struct OtherStores;

    #[async_trait]
    impl PendingTransaction for OtherStores {
        async fn complete_and_commit(
            self: Box<Self>,
            _: &idemgate_core::Lease,
            _: &idemgate_core::Completion,
            _: &[idemgate_core::audit::AuditRecord],
        ) -> Result<FencedWrite, idemgate_core::StoreError> {
            Ok(FencedWrite::Applied)
        }
        async fn commit(self: Box<Self>) -> Result<(), idemgate_core::StoreError> {
            Ok(())
        }
        async fn rollback(self: Box<Self>) -> Result<(), idemgate_core::StoreError> {
            Ok(())
        }
        fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
            self
        }
    }

    let store = harness.store(2).await;
    let slot = TransactionSlot::new();
    slot.offer(Box::new(OtherStores));
    assert!(matches!(
        Tx::begin(&store, &slot).await,
        Err(idemgate_sqlx::TxRejection::OtherStore)
    ));
    assert!(matches!(slot.take(), SlotContents::StillLent));
    harness.finish().await;
}

// --- the axum extractor ---------------------------------------------------------------

/// A route whose handler takes a `Tx` and writes the order of the operation id in the
/// request's extensions.
fn order_route<H: TransactionalHarness>(harness: &Arc<H>) -> Router<H::Store> {
    let harness = Arc::clone(harness);
    let handler = move |mut tx: Tx<H::Store>, Extension(operation_id): Extension<OperationId>| async move {
        harness
            .insert_order(&mut tx, operation_id)
            .await
            .expect("insert");
        "created"
    };
    Router::new().route("/orders", post(handler))
}

async fn post_orders(app: Router) -> Answer {
    let response = app
        .oneshot(
            Request::post("/orders")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    Answer::read(response).await
}

/// The extractor lends the slot's transaction; nothing commits before the layer does.
pub async fn extractor_lends_the_slot_transaction<H: TransactionalHarness>(harness: Arc<H>) {
    let store = harness.store(4).await;
    let operation_id = OperationId::generate();
    let slot = TransactionSlot::new();
    let app = order_route(&harness)
        .layer(Extension(slot.clone()))
        .layer(Extension(operation_id))
        .with_state(store.clone());
    let answer = post_orders(app).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let pending = returned(&slot);
    assert_eq!(
        harness.orders_for(&store, operation_id).await,
        0,
        "nothing commits before the layer"
    );
    pending.commit().await.expect("commit");
    assert_eq!(harness.orders_for(&store, operation_id).await, 1);
    harness.finish().await;
}

/// A route with a `Tx` but no layer (no slot): a 500 problem+json, not a panic.
pub async fn extractor_without_the_layer_answers_a_problem<H: TransactionalHarness>(
    harness: Arc<H>,
) {
    let store = harness.store(2).await;
    let app = order_route(&harness)
        .layer(Extension(OperationId::generate()))
        .with_state(store);
    let answer = post_orders(app).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.content_type(), Some(PROBLEM_JSON), "{answer:?}");
    let body = answer.text();
    assert!(
        body.contains("route is not behind IdempotencyLayer"),
        "{body}"
    );
    assert!(body.contains(PROBLEM_NOT_BEHIND_LAYER), "{body}");
    assert!(body.contains("\"status\":500"), "{body}");
    harness.finish().await;
}

/// A handler that takes two `Tx`s: the second is refused with a problem+json 500, and
/// the first still goes back to the slot.
pub async fn a_second_transaction_in_one_request_is_refused<H: TransactionalHarness>(
    harness: Arc<H>,
) {
    async fn greedy<S: SqlStore>(_first: Tx<S>, _second: Tx<S>) -> &'static str {
        "unreachable"
    }
    let store = harness.store(4).await;
    let slot = TransactionSlot::new();
    let app = Router::new()
        .route("/orders", post(greedy::<H::Store>))
        .layer(Extension(slot.clone()))
        .with_state(store);
    let answer = post_orders(app).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.content_type(), Some(PROBLEM_JSON), "{answer:?}");
    assert!(
        answer.text().contains("already took its transaction"),
        "{answer:?}"
    );
    // The first transaction went back to the slot when the handler's arguments dropped.
    assert!(matches!(slot.take(), SlotContents::Returned(_)));
    harness.finish().await;
}

// --- purge ----------------------------------------------------------------------------

/// `purge_expired` deletes the expired records, in batches, and nothing else.
pub async fn purge_deletes_only_expired_records_in_batches<H: TransactionalHarness>(
    harness: Arc<H>,
) {
    let store = harness.store(2).await;
    for _ in 0..25 {
        claim_with_ttl(&store, Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        claim_with_ttl(&store, DAY).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(harness.purge_expired(&store, 0).await.expect("purge"), 0);
    assert_eq!(harness.purge_expired(&store, 10).await.expect("purge"), 25);
    assert_eq!(harness.records(&store).await, 5);
    assert_eq!(harness.purge_expired(&store, 10).await.expect("purge"), 0);
    harness.finish().await;
}

/// The purge task purges on its own, and stops when its handle is dropped.
pub async fn background_purge_runs_until_dropped<H: TransactionalHarness>(harness: Arc<H>) {
    let store = harness.store(2).await;
    for _ in 0..10 {
        claim_with_ttl(&store, Duration::from_millis(50)).await;
    }
    let task = harness.spawn_purge(&store, Duration::from_millis(50), 3);
    let deadline = Instant::now() + Duration::from_secs(5);
    while harness.records(&store).await > 0 {
        assert!(Instant::now() < deadline, "the purge task did not purge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(task);
    for _ in 0..4 {
        claim_with_ttl(&store, Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        harness.records(&store).await,
        4,
        "the dropped task still purges"
    );
    harness.finish().await;
}
