//! The store conformance suite: what every [`Store`] must do, as plain async
//! functions. [`crate::store_conformance!`] instantiates all of them for one store.
//!
//! Each test makes fresh random identities ([`crate::fixtures`]), so the suite can
//! share one database with other tests and run in parallel. Timing-based tests use leases and TTLs of a few
//! hundred milliseconds and wait well past them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate_core::audit::{
    AuditEntry, AuditEvent, AuditPartition, AuditQuery, AuditRecord, ChainHash, Verifier,
};
use idemgate_core::fingerprint::{FieldDigests, Fingerprint};
use idemgate_core::record::FencingToken;
use idemgate_core::record::{RecordStatus, StoredBody, StoredResponse};
use idemgate_core::resource_lease::{LeaseAcquisition, LeaseToken, ResourceId, ResourceLease};
use idemgate_core::scope::IdentityDigest;
use idemgate_core::stream::{PIECE_BUDGET, StreamId};
use idemgate_core::{
    Claim, ClaimRequest, Completion, EvictMode, Eviction, FencedWrite, FinalStatus, Lease,
    LeaseOrigin, Snapshot, Store,
};
use tokio::sync::Barrier;

use crate::fixtures::{
    DAY, LONG, acquire, awkward_response, completion, fresh_request, request_for,
};

/// How many tasks race for one identity.
pub const RACERS: usize = 64;

async fn existing(store: &dyn Store, request: &ClaimRequest) -> Snapshot {
    match store.try_claim(request).await.expect("claim") {
        Claim::Existing(snapshot) => snapshot,
        Claim::Acquired(lease) => panic!("expected an existing record, acquired {lease:?}"),
    }
}

async fn evict(store: &dyn Store, identity: &IdentityDigest, mode: EvictMode) -> Eviction {
    store.evict(identity, mode).await.expect("evict")
}

async fn get(store: &dyn Store, request: &ClaimRequest) -> Option<Snapshot> {
    store.get(request.identity.digest()).await.expect("get")
}

/// `n` real tasks claim with `request` at once, released by a barrier.
async fn claim_concurrently(store: &Arc<dyn Store>, request: ClaimRequest, n: usize) -> Vec<Claim> {
    let request = Arc::new(request);
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (store, request, barrier) = (
                Arc::clone(store),
                Arc::clone(&request),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                store.try_claim(&request).await.expect("claim")
            })
        })
        .collect();
    let mut claims = Vec::with_capacity(n);
    for task in tasks {
        claims.push(task.await.expect("claim task"));
    }
    claims
}

/// The per-field digests of a JSON body, keyed by `request`'s identity as the
/// layer keys them.
fn field_digests(request: &ClaimRequest, body: &str) -> Option<FieldDigests> {
    let key = request.identity.digest().as_bytes();
    Some(FieldDigests::of_json(body.as_bytes(), key).expect("a JSON body"))
}

/// The per-field digests a claim carries come back with its record, exactly: to
/// a claim with another body (which then learns that `/amount` differs), through
/// a release and a takeover, after completion, and on `get`; a set the bounds cut
/// short keeps saying so.
pub async fn field_digests_round_trip(store: Arc<dyn Store>) {
    let mut request = fresh_request();
    request.field_digests = field_digests(
        &request,
        r#"{"amount":1500,"currency":"RUB","items":[{"sku":"BOOK-1","quantity":2}]}"#,
    );
    let mut other = ClaimRequest {
        fingerprint: Fingerprint::from_bytes([2; 32]),
        ..request.clone()
    };
    other.field_digests = field_digests(
        &request,
        r#"{"amount":1600,"currency":"RUB","items":[{"sku":"BOOK-1","quantity":2}]}"#,
    );
    let lease = acquire(&*store, &request).await;
    let seen = existing(&*store, &other).await;
    assert_eq!(
        seen.record.field_digests, request.field_digests,
        "while in progress"
    );
    let differing = seen
        .record
        .differing(other.field_digests.as_ref())
        .expect("both requests have digests");
    assert_eq!(differing.pointers, ["/amount"]);
    assert!(differing.complete);
    assert_eq!(
        store.release(&lease).await.expect("release"),
        FencedWrite::Applied
    );
    let lease = acquire(&*store, &request).await;
    assert_eq!(lease.origin, LeaseOrigin::Released);
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let seen = existing(&*store, &other).await;
    assert_eq!(
        seen.record.field_digests, request.field_digests,
        "once completed"
    );
    let read = get(&*store, &request).await.expect("record present");
    assert_eq!(read.record.field_digests, request.field_digests, "on get");

    // More fields than a record keeps: kept cut short, and marked so.
    let mut wide = fresh_request();
    let members: Vec<String> = (0..40).map(|i| format!("\"f{i:02}\":{i}")).collect();
    wide.field_digests = field_digests(&wide, &format!("{{{}}}", members.join(",")));
    assert!(!wide.field_digests.as_ref().expect("digests").is_complete());
    acquire(&*store, &wide).await;
    let read = get(&*store, &wide).await.expect("record present");
    assert_eq!(read.record.field_digests, wide.field_digests);
}

/// A record written without digests (a body that is not JSON, or a build before
/// they were kept) reads back without them, and a request with another body
/// learns nothing about fields from it: the 422 names none.
pub async fn records_without_field_digests_name_nothing(store: Arc<dyn Store>) {
    let request = fresh_request();
    assert_eq!(request.field_digests, None);
    acquire(&*store, &request).await;
    let mut other = ClaimRequest {
        fingerprint: Fingerprint::from_bytes([2; 32]),
        ..request.clone()
    };
    other.field_digests = field_digests(&request, r#"{"amount":1}"#);
    let seen = existing(&*store, &other).await;
    assert_eq!(seen.record.field_digests, None);
    assert_eq!(seen.record.differing(other.field_digests.as_ref()), None);
}

/// N ≥ 64 real tasks claim one identity at once: exactly one wins, every other sees
/// the winner's `Processing` record.
pub async fn concurrent_claims_have_exactly_one_winner(store: Arc<dyn Store>) {
    let claims = claim_concurrently(&store, fresh_request(), RACERS).await;
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for claim in claims {
        match claim {
            Claim::Acquired(lease) => winners.push(lease),
            Claim::Existing(snapshot) => losers.push(snapshot),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "{} of {RACERS} concurrent claims won; exactly one may",
        winners.len()
    );
    let winner = &winners[0];
    assert_eq!(winner.origin, LeaseOrigin::New);
    for loser in &losers {
        assert_eq!(loser.record.status(), RecordStatus::Processing);
        assert_eq!(loser.record.operation_id, winner.operation_id);
        assert_eq!(loser.record.token, winner.token);
        assert!(loser.record.lease_is_live(loser.now));
    }
}

/// Complete, then claim again: the stored response comes back, byte for byte, with
/// the same operation id; `get` sees the same.
pub async fn complete_then_claim_replays(store: Arc<dyn Store>) {
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let snapshot = existing(&*store, &request).await;
    assert_eq!(snapshot.record.status(), RecordStatus::Completed);
    assert_eq!(snapshot.record.operation_id, lease.operation_id);
    assert_eq!(snapshot.record.response(), Some(&awkward_response()));
    assert_eq!(snapshot.record.locked_until(), None);
    assert_eq!(snapshot.record.fingerprint, request.fingerprint);
    let read = get(&*store, &request).await.expect("record present");
    assert_eq!(read.record.response(), Some(&awkward_response()));
}

/// A `Failed` completion is stored and replayed like a `Completed` one.
pub async fn failed_completion_is_stored(store: Arc<dyn Store>) {
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    let response = StoredResponse {
        trailers: Vec::new(),
        status: StatusCode::INTERNAL_SERVER_ERROR,
        headers: vec![],
        body: StoredBody::Retained(Bytes::from_static(b"boom")),
    };
    let failed = Completion {
        status: FinalStatus::Failed,
        response: response.clone(),
        ttl: DAY,
    };
    assert_eq!(
        store.complete(&lease, &failed).await.expect("complete"),
        FencedWrite::Applied
    );
    let snapshot = existing(&*store, &request).await;
    assert_eq!(snapshot.record.status(), RecordStatus::Failed);
    assert_eq!(snapshot.record.response(), Some(&response));
}

/// Same key, other fingerprint: the existing record is returned untouched, in every
/// state, and never taken over (not even when released or lapsed).
pub async fn fingerprint_mismatch_is_visible(store: Arc<dyn Store>) {
    let request = fresh_request();
    let other = ClaimRequest {
        fingerprint: Fingerprint::from_bytes([2; 32]),
        ..request.clone()
    };
    let lease = acquire(&*store, &request).await;
    let seen = existing(&*store, &other).await;
    assert_eq!(seen.record.fingerprint, request.fingerprint);
    assert_eq!(seen.record.status(), RecordStatus::Processing);

    assert_eq!(
        store.release(&lease).await.expect("release"),
        FencedWrite::Applied
    );
    let seen = existing(&*store, &other).await;
    assert_eq!(
        seen.record.status(),
        RecordStatus::Released,
        "a released record is not taken over by another fingerprint"
    );
    assert_eq!(seen.record.operation_id, lease.operation_id);

    let lease = acquire(&*store, &request).await;
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let seen = existing(&*store, &other).await;
    assert_eq!(seen.record.status(), RecordStatus::Completed);
    assert_eq!(seen.record.fingerprint, request.fingerprint);
}

/// Release, then claim: acquired again with the same operation id and a new token.
pub async fn release_makes_the_record_claimable(store: Arc<dyn Store>) {
    let request = fresh_request();
    let first = acquire(&*store, &request).await;
    assert_eq!(
        store.release(&first).await.expect("release"),
        FencedWrite::Applied
    );
    let read = get(&*store, &request)
        .await
        .expect("released record is kept");
    assert_eq!(read.record.status(), RecordStatus::Released);
    let second = acquire(&*store, &request).await;
    assert_eq!(second.origin, LeaseOrigin::Released);
    assert_eq!(
        second.operation_id, first.operation_id,
        "a release keeps the operation id"
    );
    assert_ne!(second.token, first.token, "every claim gets a new token");
    assert_eq!(
        store
            .complete(&first, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Refused
    );
    assert_eq!(
        store
            .complete(&second, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
}

/// A live lease is never taken over; once it lapses, exactly one of many concurrent
/// claimants takes it over, with the same operation id and a new token.
pub async fn lapsed_lease_has_exactly_one_takeover(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        lease: Duration::from_millis(300),
        ..fresh_request()
    };
    let first = acquire(&*store, &request).await;
    let live = existing(&*store, &request).await;
    assert_eq!(
        live.record.status(),
        RecordStatus::Processing,
        "a live lease is not taken over"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;

    let request = ClaimRequest {
        lease: LONG,
        ..request
    };
    let claims = claim_concurrently(&store, request, 16).await;
    let mut takeovers = Vec::new();
    for claim in claims {
        if let Claim::Acquired(lease) = claim {
            takeovers.push(lease);
        }
    }
    assert_eq!(
        takeovers.len(),
        1,
        "{} concurrent takeovers of one lapsed lease; exactly one may",
        takeovers.len()
    );
    assert_eq!(takeovers[0].origin, LeaseOrigin::TakenOver);
    assert_eq!(
        takeovers[0].operation_id, first.operation_id,
        "a takeover keeps the operation id"
    );
    assert_ne!(takeovers[0].token, first.token);
}

/// After a takeover the old holder's (operation id, token) writes nothing: not
/// complete, release, renew nor delete; nor does a lease with the right operation id
/// and a wrong token, or the reverse.
pub async fn stale_lease_cannot_write(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let stale = acquire(&*store, &request).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = acquire(
        &*store,
        &ClaimRequest {
            lease: LONG,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(current.origin, LeaseOrigin::TakenOver);

    let wrong_token = Lease {
        token: stale.token,
        ..current.clone()
    };
    let wrong_operation = Lease {
        operation_id: idemgate_core::record::OperationId::generate(),
        ..current.clone()
    };
    for lease in [&stale, &wrong_token, &wrong_operation] {
        assert_eq!(
            store
                .complete(lease, &completion(awkward_response()))
                .await
                .expect("complete"),
            FencedWrite::Refused
        );
        assert_eq!(
            store.release(lease).await.expect("release"),
            FencedWrite::Refused
        );
        assert_eq!(
            store.renew(lease, LONG).await.expect("renew"),
            FencedWrite::Refused
        );
        assert_eq!(
            store.delete(lease).await.expect("delete"),
            FencedWrite::Refused
        );
    }
    let read = get(&*store, &request).await.expect("record untouched");
    assert_eq!(read.record.status(), RecordStatus::Processing);
    assert_eq!(read.record.token, current.token);
    assert!(read.record.lease_is_live(read.now));
    assert_eq!(
        store
            .complete(&current, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
}

/// A lease from an expired earlier incarnation of the same identity cannot write to
/// the new one, which is a new operation.
pub async fn expired_incarnation_cannot_write(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ttl: Duration::from_millis(400),
        ..fresh_request()
    };
    let old = acquire(&*store, &request).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let new = acquire(
        &*store,
        &ClaimRequest {
            lease: LONG,
            ttl: DAY,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(new.origin, LeaseOrigin::New, "an expired record is absent");
    assert_ne!(
        new.operation_id, old.operation_id,
        "an expired key starts a new operation"
    );
    assert_eq!(
        store
            .complete(&old, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Refused
    );
    assert_eq!(
        store.release(&old).await.expect("release"),
        FencedWrite::Refused
    );
    assert_eq!(
        store.renew(&old, LONG).await.expect("renew"),
        FencedWrite::Refused
    );
    assert_eq!(
        store.delete(&old).await.expect("delete"),
        FencedWrite::Refused
    );
    assert_eq!(
        store
            .complete(&new, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
}

/// A completed record expires `ttl` after completion without any purge: `get` no
/// longer sees it and a claim starts a new operation.
pub async fn ttl_expiry_without_purge(store: Arc<dyn Store>) {
    let request = fresh_request();
    let first = acquire(&*store, &request).await;
    let short = Completion {
        ttl: Duration::from_millis(400),
        ..completion(awkward_response())
    };
    assert_eq!(
        store.complete(&first, &short).await.expect("complete"),
        FencedWrite::Applied
    );
    assert!(get(&*store, &request).await.is_some());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        get(&*store, &request).await.is_none(),
        "an expired record is absent to get"
    );
    let second = acquire(&*store, &request).await;
    assert_eq!(second.origin, LeaseOrigin::New);
    assert_ne!(second.operation_id, first.operation_id);
}

/// Completion restarts the TTL: a record claimed with a short TTL lives `ttl` after
/// it completes.
pub async fn completion_restarts_the_ttl(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        ttl: Duration::from_millis(500),
        ..fresh_request()
    };
    let lease = acquire(&*store, &request).await;
    let long = Completion {
        ttl: DAY,
        ..completion(awkward_response())
    };
    assert_eq!(
        store.complete(&lease, &long).await.expect("complete"),
        FencedWrite::Applied
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let read = get(&*store, &request)
        .await
        .expect("completion set expires_at = now + ttl");
    assert_eq!(read.record.status(), RecordStatus::Completed);
}

/// A record taken up again near the end of its life lives on for the new run:
/// `expires_at` becomes at least `now + ttl`, or it would expire mid-run and its key
/// would start a second operation.
pub async fn takeover_extends_the_record_life(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        ttl: Duration::from_millis(600),
        ..fresh_request()
    };
    let first = acquire(&*store, &request).await;
    assert_eq!(
        store.release(&first).await.expect("release"),
        FencedWrite::Applied
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = acquire(
        &*store,
        &ClaimRequest {
            ttl: DAY,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(again.origin, LeaseOrigin::Released);
    tokio::time::sleep(Duration::from_millis(600)).await; // past the first claim's expiry
    let read = get(&*store, &request)
        .await
        .expect("the reclaimed record must not expire mid-run");
    assert_eq!(read.record.operation_id, first.operation_id);
    assert_eq!(read.record.token, again.token);
}

/// Renewal pushes `locked_until` out, so a live holder is not taken over.
pub async fn renew_extends_the_lease(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        lease: Duration::from_millis(400),
        ..fresh_request()
    };
    let lease = acquire(&*store, &request).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        store
            .renew(&lease, Duration::from_secs(5))
            .await
            .expect("renew"),
        FencedWrite::Applied
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = existing(&*store, &request).await;
    assert_eq!(
        seen.record.token, lease.token,
        "a renewed lease was taken over"
    );
    assert!(seen.record.lease_is_live(seen.now));
}

/// Delete frees the key: the next claim, even with another body, is a new operation.
pub async fn delete_frees_the_key(store: Arc<dyn Store>) {
    let request = fresh_request();
    let first = acquire(&*store, &request).await;
    assert_eq!(
        store.delete(&first).await.expect("delete"),
        FencedWrite::Applied
    );
    assert!(get(&*store, &request).await.is_none());
    let corrected = ClaimRequest {
        fingerprint: Fingerprint::from_bytes([9; 32]),
        ..request
    };
    let second = acquire(&*store, &corrected).await;
    assert_eq!(second.origin, LeaseOrigin::New);
    assert_ne!(second.operation_id, first.operation_id);
}

/// Writes after completion are refused: a record completes once.
pub async fn completed_record_refuses_further_writes(store: Arc<dyn Store>) {
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let other = StoredResponse {
        trailers: Vec::new(),
        status: StatusCode::OK,
        headers: vec![],
        body: StoredBody::NotRetained,
    };
    assert_eq!(
        store
            .complete(&lease, &completion(other))
            .await
            .expect("complete"),
        FencedWrite::Refused
    );
    assert_eq!(
        store.release(&lease).await.expect("release"),
        FencedWrite::Refused
    );
    assert_eq!(
        store.delete(&lease).await.expect("delete"),
        FencedWrite::Refused
    );
    let read = get(&*store, &request).await.expect("kept");
    assert_eq!(read.record.response(), Some(&awkward_response()));
}

/// Same key under another principal, method or path is an independent operation.
pub async fn scopes_are_isolated(store: Arc<dyn Store>) {
    let principal = uuid::Uuid::new_v4().to_string();
    let other_principal = uuid::Uuid::new_v4().to_string();
    let base = request_for(&principal, "POST", "/orders", "shared-key", 1);
    let lease = acquire(&*store, &base).await;
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    for other in [
        request_for(&other_principal, "POST", "/orders", "shared-key", 1),
        request_for(&principal, "PATCH", "/orders", "shared-key", 1),
        request_for(&principal, "POST", "/payments", "shared-key", 1),
    ] {
        let lease = acquire(&*store, &other).await;
        assert_eq!(lease.origin, LeaseOrigin::New);
        assert!(
            get(&*store, &other)
                .await
                .expect("own record")
                .record
                .response()
                .is_none()
        );
    }
    assert_eq!(
        existing(&*store, &base).await.record.response(),
        Some(&awkward_response())
    );
}

/// Headers keep their order and repeats, values their bytes, bodies every byte; a
/// "not retained" body stays distinct from an empty one.
pub async fn responses_round_trip_byte_exact(store: Arc<dyn Store>) {
    let big = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::Retained(Bytes::from(
            (0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )),
        ..awkward_response()
    };
    let empty = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::Retained(Bytes::new()),
        headers: vec![],
        ..awkward_response()
    };
    let not_retained = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::NotRetained,
        ..awkward_response()
    };
    for response in [awkward_response(), big, empty, not_retained] {
        let request = fresh_request();
        let lease = acquire(&*store, &request).await;
        assert_eq!(
            store
                .complete(&lease, &completion(response.clone()))
                .await
                .expect("complete"),
            FencedWrite::Applied
        );
        let replayed = existing(&*store, &request).await.record.state;
        assert_eq!(replayed.response(), Some(&response));
    }
}

/// Reading an identity nobody claimed finds nothing, and waiting on it returns
/// within its timeout.
pub async fn absent_records_and_bounded_waits(store: Arc<dyn Store>) {
    let request = fresh_request();
    assert!(get(&*store, &request).await.is_none());
    let waited = tokio::time::timeout(
        Duration::from_secs(5),
        store.wait_for_change(request.identity.digest(), Duration::from_millis(50)),
    )
    .await;
    assert!(waited.is_ok(), "wait_for_change ignored its timeout");
}

/// A waiter on a record learns of its completion well before its timeout when the
/// change happens through the same store handle.
pub async fn waiters_wake_on_completion(store: Arc<dyn Store>) {
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    let waited = wait_while(&store, *request.identity.digest(), |snapshot| {
        !snapshot.is_some_and(|s| s.record.status().is_final())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let waited = waited.await.expect("waiter");
    assert!(
        waited < Duration::from_secs(5),
        "waiter saw the completion only after {waited:?}: completions must wake waiters on the same store handle"
    );
}

/// Spawns a waiter that waits for changes of `digest` while `waiting` holds for
/// what `get` reads, and returns how long it waited.
fn wait_while(
    store: &Arc<dyn Store>,
    digest: IdentityDigest,
    waiting: impl Fn(Option<Snapshot>) -> bool + Send + Sync + 'static,
) -> tokio::task::JoinHandle<Duration> {
    let store = Arc::clone(store);
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        loop {
            // One long wait: a store that only sleeps out the timeout (polls)
            // instead of waking its waiters fails the callers' bound.
            store
                .wait_for_change(&digest, Duration::from_secs(10))
                .await;
            let still = waiting(store.get(&digest).await.expect("get"));
            if !still || start.elapsed() > Duration::from_secs(20) {
                return start.elapsed();
            }
        }
    })
}

/// Evicting a completed record frees its key: `get` finds nothing, the next claim
/// (even with another body) is a new operation, and a second eviction finds nothing
/// to remove. A released record is evicted the same way.
pub async fn evict_frees_a_completed_key(store: Arc<dyn Store>) {
    let request = fresh_request();
    let digest = *request.identity.digest();
    let first = acquire_completed(&*store, &request, DAY).await;
    assert_eq!(
        evict(&*store, &digest, EvictMode::UnlessRunning).await,
        Eviction::Evicted {
            status: RecordStatus::Completed
        }
    );
    assert!(
        get(&*store, &request).await.is_none(),
        "evicted yet readable"
    );
    assert_eq!(
        evict(&*store, &digest, EvictMode::UnlessRunning).await,
        Eviction::Absent
    );
    let again = acquire(
        &*store,
        &ClaimRequest {
            fingerprint: Fingerprint::from_bytes([9; 32]),
            ..request.clone()
        },
    )
    .await;
    assert_eq!(again.origin, LeaseOrigin::New, "an evicted key is new");
    assert_ne!(again.operation_id, first.operation_id);
    assert_eq!(
        store.release(&again).await.expect("release"),
        FencedWrite::Applied
    );
    assert_eq!(
        evict(&*store, &digest, EvictMode::UnlessRunning).await,
        Eviction::Evicted {
            status: RecordStatus::Released
        }
    );
}

/// A `Processing` record with a live lease is refused without force and left as it
/// was; forced, it is removed, the holder's completion is fenced out, and a waiter
/// on the key is woken.
pub async fn evict_refuses_a_live_lease_unless_forced(store: Arc<dyn Store>) {
    let request = fresh_request();
    let digest = *request.identity.digest();
    let lease = acquire(&*store, &request).await;
    let refused = evict(&*store, &digest, EvictMode::UnlessRunning).await;
    let Eviction::RefusedLiveLease { locked_until, now } = refused else {
        panic!("a live lease was not refused: {refused:?}");
    };
    assert_eq!(
        locked_until, lease.locked_until,
        "the refusal names the lease"
    );
    assert!(
        now < locked_until,
        "a live lease ends after the store's now"
    );
    let read = get(&*store, &request)
        .await
        .expect("a refused record stays");
    assert_eq!(read.record.status(), RecordStatus::Processing);
    assert_eq!(read.record.token, lease.token);

    let waited = wait_while(&store, digest, |snapshot| snapshot.is_some());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        evict(&*store, &digest, EvictMode::Force).await,
        Eviction::Evicted {
            status: RecordStatus::Processing
        }
    );
    let waited = waited.await.expect("waiter");
    assert!(
        waited < Duration::from_secs(5),
        "waiter saw the eviction only after {waited:?}: evictions must wake waiters on the same store handle"
    );
    assert!(get(&*store, &request).await.is_none());
    assert_eq!(
        store
            .complete(&lease, &completion(awkward_response()))
            .await
            .expect("complete"),
        FencedWrite::Refused,
        "the evicted holder's completion must be fenced out"
    );
    assert!(get(&*store, &request).await.is_none());
}

/// Nothing to evict: a key never claimed, and one whose record expired (without a
/// purge), are absent, forced or not.
pub async fn evict_absent_or_expired_key(store: Arc<dyn Store>) {
    let never = fresh_request();
    for mode in [EvictMode::UnlessRunning, EvictMode::Force] {
        assert_eq!(
            evict(&*store, never.identity.digest(), mode).await,
            Eviction::Absent
        );
    }
    let request = fresh_request();
    acquire_completed(&*store, &request, Duration::from_millis(300)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        evict(&*store, request.identity.digest(), EvictMode::Force).await,
        Eviction::Absent,
        "an expired record is absent to evict"
    );
}

/// A `Processing` record whose lease lapsed has no live holder: it is evicted
/// without force.
pub async fn evict_lapsed_lease_without_force(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let lease = acquire(&*store, &request).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        evict(&*store, request.identity.digest(), EvictMode::UnlessRunning).await,
        Eviction::Evicted {
            status: RecordStatus::Processing
        }
    );
    assert_eq!(
        store.renew(&lease, LONG).await.expect("renew"),
        FencedWrite::Refused
    );
    assert!(get(&*store, &request).await.is_none());
}

/// Many real tasks evict one completed record at once: exactly one removes it, the
/// others find nothing (an eviction is one atomic step, not a read then a delete).
pub async fn concurrent_evictions_remove_once(store: Arc<dyn Store>) {
    let request = fresh_request();
    acquire_completed(&*store, &request, DAY).await;
    let digest = *request.identity.digest();
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                evict(&*store, &digest, EvictMode::UnlessRunning).await
            })
        })
        .collect();
    let mut evicted = 0;
    for task in tasks {
        match task.await.expect("evict task") {
            Eviction::Evicted { status } => {
                assert_eq!(status, RecordStatus::Completed);
                evicted += 1;
            }
            Eviction::Absent => {}
            other => panic!("a completed record answered {other:?}"),
        }
    }
    assert_eq!(
        evicted, 1,
        "{evicted} of {RACERS} concurrent evictions removed the record; exactly one may"
    );
}

/// A resource no other test uses.
fn fresh_resource() -> ResourceId {
    ResourceId::new(&format!("conformance/{}", uuid::Uuid::new_v4()))
}

async fn acquire_lease(store: &dyn Store, resource: &ResourceId, ttl: Duration) -> ResourceLease {
    match store
        .acquire_resource_lease(resource, ttl)
        .await
        .expect("acquire resource lease")
    {
        LeaseAcquisition::Acquired(lease) => lease,
        held => panic!("expected to acquire a free resource, got {held:?}"),
    }
}

async fn lease_held(store: &dyn Store, resource: &ResourceId) -> bool {
    matches!(
        store
            .acquire_resource_lease(resource, LONG)
            .await
            .expect("acquire resource lease"),
        LeaseAcquisition::Held { .. }
    )
}

/// N ≥ 64 real tasks acquire one free resource at once: exactly one holds it,
/// every other is told it is held until the winner's lease ends.
pub async fn resource_lease_has_exactly_one_holder(store: Arc<dyn Store>) {
    let resource = fresh_resource();
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .acquire_resource_lease(&resource, LONG)
                    .await
                    .expect("acquire resource lease")
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut held = Vec::new();
    for task in tasks {
        match task.await.expect("acquire task") {
            LeaseAcquisition::Acquired(lease) => winners.push(lease),
            LeaseAcquisition::Held { until, now } => held.push((until, now)),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "{} of {RACERS} concurrent acquisitions won; exactly one may",
        winners.len()
    );
    let winner = &winners[0];
    assert_eq!(winner.resource, resource);
    for (until, now) in held {
        assert_eq!(until, winner.until, "a loser sees the winner's lease end");
        assert!(until > now, "a held lease is live on the store's clock");
        assert!(until.duration_since(now) <= LONG);
    }
    assert_eq!(
        store.release_resource_lease(winner).await.expect("release"),
        FencedWrite::Applied
    );
}

/// Real tasks take turns on one resource, each waiting for it: never two inside
/// at once, and every turn happens.
pub async fn resource_lease_excludes_under_contention(store: Arc<dyn Store>) {
    const TASKS: usize = 8;
    const TURNS: usize = 3;
    let resource = fresh_resource();
    let inside = Arc::new(AtomicUsize::new(0));
    let turns = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            let (inside, turns) = (Arc::clone(&inside), Arc::clone(&turns));
            tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..TURNS {
                    let lease = loop {
                        match store
                            .acquire_resource_lease(&resource, LONG)
                            .await
                            .expect("acquire resource lease")
                        {
                            LeaseAcquisition::Acquired(lease) => break lease,
                            LeaseAcquisition::Held { .. } => {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                        }
                    };
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders of one resource lease at once"
                    );
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    turns.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        store.release_resource_lease(&lease).await.expect("release"),
                        FencedWrite::Applied
                    );
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("turn-taking task");
    }
    assert_eq!(turns.load(Ordering::SeqCst), TASKS * TURNS);
}

/// A lease nobody releases ends at its TTL: another holder gets in, with a new
/// token, and the first holder's late release is refused and frees nothing.
pub async fn resource_lease_expiry_lets_another_holder_in(store: Arc<dyn Store>) {
    let resource = fresh_resource();
    let first = acquire_lease(&*store, &resource, Duration::from_millis(300)).await;
    assert!(lease_held(&*store, &resource).await, "held within its TTL");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        store.release_resource_lease(&first).await.expect("release"),
        FencedWrite::Refused,
        "a lapsed lease is not released by its old holder"
    );
    let second = acquire_lease(&*store, &resource, LONG).await;
    assert_ne!(
        second.token, first.token,
        "every acquisition has its own token"
    );
    assert_eq!(
        store.release_resource_lease(&first).await.expect("release"),
        FencedWrite::Refused,
        "the stale token cannot release the new holder's lease"
    );
    assert!(
        lease_held(&*store, &resource).await,
        "the new holder keeps it"
    );
    assert_eq!(
        store
            .release_resource_lease(&second)
            .await
            .expect("release"),
        FencedWrite::Applied
    );
}

/// Release is fenced by the token: another token releases nothing; the holder's
/// release frees the resource at once, and only once.
pub async fn resource_lease_release_is_fenced(store: Arc<dyn Store>) {
    let resource = fresh_resource();
    let other = fresh_resource();
    let lease = acquire_lease(&*store, &resource, LONG).await;
    // Resources are independent.
    let beside = acquire_lease(&*store, &other, LONG).await;
    let forged = ResourceLease {
        token: LeaseToken::random(),
        ..lease.clone()
    };
    assert_eq!(
        store
            .release_resource_lease(&forged)
            .await
            .expect("release"),
        FencedWrite::Refused
    );
    assert!(
        lease_held(&*store, &resource).await,
        "a foreign token freed nothing"
    );
    assert_eq!(
        store.release_resource_lease(&lease).await.expect("release"),
        FencedWrite::Applied
    );
    assert_eq!(
        store.release_resource_lease(&lease).await.expect("release"),
        FencedWrite::Refused,
        "released once"
    );
    let again = acquire_lease(&*store, &resource, LONG).await;
    assert_ne!(again.token, lease.token);
    assert!(
        lease_held(&*store, &other).await,
        "the other resource stayed held"
    );
    for held in [again, beside] {
        assert_eq!(
            store.release_resource_lease(&held).await.expect("release"),
            FencedWrite::Applied
        );
    }
}

/// Claims `request` and completes it with [`awkward_response`], kept for `ttl`.
async fn acquire_completed(store: &dyn Store, request: &ClaimRequest, ttl: Duration) -> Lease {
    let lease = acquire(store, request).await;
    let done = Completion {
        ttl,
        ..completion(awkward_response())
    };
    assert_eq!(
        store.complete(&lease, &done).await.expect("complete"),
        FencedWrite::Applied
    );
    lease
}

/// One journal record of `instance`, numbered `n` in its status (and, by
/// `n`, with or without its optional fields).
pub fn audit_record(instance: &str, event: AuditEvent, n: u16) -> AuditRecord {
    AuditRecord {
        event: Some(event),
        operation_id: Some(idemgate_core::record::OperationId::generate().to_string()),
        method: "POST".into(),
        route: "/orders/{id}".into(),
        principal: "tenant:7/user:42".into(),
        key_digest: "ab".repeat(32),
        fingerprint: (n % 2 == 0).then(|| "cd".repeat(32)),
        status: Some(200 + n),
        duration_ms: (n % 3 == 0).then_some(u64::from(n) * 7),
        instance: instance.into(),
    }
}

/// `instance`'s entries in the whole journal, oldest first, read page by page.
pub async fn audit_of(store: &dyn Store, instance: &str) -> Vec<AuditEntry> {
    let mut mine = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .read_audit(&AuditQuery {
                after,
                ..AuditQuery::all(500)
            })
            .await
            .expect("read_audit");
        let Some(last) = page.last() else { break };
        after = Some(last.seq);
        mine.extend(page.into_iter().filter(|e| e.record.instance == instance));
    }
    mine
}

/// Verifies `instance`'s partition alone (the suite shares its journal with
/// other tests' partitions): the number of entries verified.
pub async fn verify_partition(store: &dyn Store, instance: &str, entries: &[AuditEntry]) -> u64 {
    let partitions: Vec<AuditPartition> = store
        .audit_partitions()
        .await
        .expect("audit_partitions")
        .into_iter()
        .filter(|p| p.instance == instance)
        .collect();
    assert_eq!(partitions.len(), 1, "one partition per instance");
    assert_eq!(
        partitions[0].entries,
        entries.len() as u64,
        "the partition counts the entries it keeps"
    );
    let mut verifier = Verifier::new(&partitions);
    for entry in entries {
        verifier.push(entry).unwrap_or_else(|e| panic!("{e}"));
    }
    verifier.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// The journal, written as one instance by two processes (`one` and `two`,
/// stores over the same backend): a store that keeps what it last wrote to
/// append the next batch without reading (the heads Redis's and PostgreSQL's
/// writers remember, SQLite's hint) must
/// notice the other's entries in between, so the partition stays one chain
/// with every entry in it, in the order the appends returned, and `at` never
/// goes back.
pub async fn audit_appenders_of_one_instance_keep_one_chain(
    one: Arc<dyn Store>,
    two: Arc<dyn Store>,
) {
    let instance = format!("conformance-{}", uuid::Uuid::new_v4());
    let mut appended = Vec::new();
    for (round, store) in [&one, &two, &one, &one, &two, &two, &one]
        .into_iter()
        .enumerate()
    {
        let round = u16::try_from(round).expect("a few rounds");
        let batch = [
            audit_record(&instance, AuditEvent::Replayed, 2 * round),
            audit_record(&instance, AuditEvent::Conflict, 2 * round + 1),
        ];
        store.append_audit(&batch).await.expect("append_audit");
        appended.extend(batch);
    }
    for store in [&one, &two] {
        let entries = audit_of(store.as_ref(), &instance).await;
        let read: Vec<AuditRecord> = entries.iter().map(|e| e.record.clone()).collect();
        assert_eq!(read, appended, "every entry, in the order appended");
        assert!(
            entries.windows(2).all(|w| w[0].at <= w[1].at),
            "at never goes back"
        );
        assert_eq!(
            verify_partition(store.as_ref(), &instance, &entries).await,
            appended.len() as u64,
            "one chain"
        );
    }
    // Leave the shared journal as small as found.
    let later = idemgate_core::time::Timestamp::now().saturating_add(Duration::from_secs(60));
    one.trim_audit(Some(&instance), later, 100_000)
        .await
        .expect("trim_audit");
}

/// The journal: appended batches come back field for field, in order, numbered
/// by increasing `seq`, timestamped by the store and chained per instance —
/// also when many tasks of two instances append at once (no chain forks, none
/// lost); ranges by `seq` and time select; the secret is made once; retention
/// removes the oldest of a partition and leaves it verifiable from its anchor.
pub async fn audit_journal_round_trips_and_chains(store: Arc<dyn Store>) {
    let one = format!("conformance-{}", uuid::Uuid::new_v4());
    let two = format!("conformance-{}", uuid::Uuid::new_v4());
    let secret = store.audit_secret().await.expect("audit_secret");
    assert_eq!(
        store.audit_secret().await.expect("audit_secret").as_bytes(),
        secret.as_bytes(),
        "the journal's secret is made once"
    );
    store.append_audit(&[]).await.expect("an empty append");

    // One batch, every event, read back exactly.
    let batch: Vec<AuditRecord> = AuditEvent::ALL
        .into_iter()
        .zip(0..)
        .map(|(event, n)| audit_record(&one, event, n))
        .collect();
    let before = idemgate_core::time::Timestamp::now();
    store.append_audit(&batch).await.expect("append_audit");
    let entries = audit_of(store.as_ref(), &one).await;
    let read: Vec<AuditRecord> = entries.iter().map(|e| e.record.clone()).collect();
    assert_eq!(read, batch, "entries come back field for field, in order");
    assert!(entries.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(
        entries
            .iter()
            .all(|e| e.at.as_millis() >= before.as_millis() - 5_000),
        "at is the store's clock, now"
    );
    assert_eq!(entries[0].prev, ChainHash::GENESIS);
    assert_eq!(verify_partition(store.as_ref(), &one, &entries).await, 10);

    // Many writers of two instances at once: each chain stays one chain.
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            let instance = if i % 2 == 0 { one.clone() } else { two.clone() };
            tokio::spawn(async move {
                let records: Vec<_> = (0..3)
                    .map(|n| audit_record(&instance, AuditEvent::Replayed, n))
                    .collect();
                barrier.wait().await;
                store.append_audit(&records).await.expect("append_audit");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("append task");
    }
    let ones = audit_of(store.as_ref(), &one).await;
    let twos = audit_of(store.as_ref(), &two).await;
    assert_eq!(ones.len(), 10 + RACERS / 2 * 3, "no entry lost");
    assert_eq!(twos.len(), RACERS / 2 * 3, "no entry lost");
    assert_eq!(
        verify_partition(store.as_ref(), &one, &ones).await,
        ones.len() as u64
    );
    assert_eq!(
        verify_partition(store.as_ref(), &two, &twos).await,
        twos.len() as u64
    );

    // Ranges: after a seq, and by time.
    let after = store
        .read_audit(&AuditQuery {
            after: Some(ones[4].seq),
            ..AuditQuery::all(3)
        })
        .await
        .expect("read_audit");
    assert_eq!(after.len(), 3, "limit holds");
    assert!(after.iter().all(|e| e.seq > ones[4].seq));
    let future = idemgate_core::time::Timestamp::now().saturating_add(Duration::from_secs(3_600));
    let none = store
        .read_audit(&AuditQuery {
            since: Some(future),
            ..AuditQuery::all(10)
        })
        .await
        .expect("read_audit");
    assert!(none.is_empty(), "nothing written in the future");
    let until = store
        .read_audit(&AuditQuery {
            until: Some(ones[0].at),
            after: Some(ones[0].seq - 1),
            ..AuditQuery::all(10)
        })
        .await
        .expect("read_audit");
    assert!(until.iter().all(|e| e.at < ones[0].at), "until excludes");

    // Retention, of one partition: the oldest go, the rest verifies from the
    // anchor; the other partition is untouched.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let later = audit_record(&one, AuditEvent::Expired, 1);
    store.append_audit(&[later]).await.expect("append_audit");
    let cutoff = audit_of(store.as_ref(), &one)
        .await
        .last()
        .expect("entries")
        .at;
    let trimmed = store
        .trim_audit(Some(&one), cutoff, 7)
        .await
        .expect("trim_audit");
    assert_eq!(trimmed, 7, "bounded by the limit");
    let kept = audit_of(store.as_ref(), &one).await;
    assert_eq!(kept.len(), ones.len() + 1 - 7);
    assert_eq!(kept[0].seq, ones[7].seq, "the oldest went first");
    assert_eq!(
        verify_partition(store.as_ref(), &one, &kept).await,
        kept.len() as u64
    );
    let trimmed = store
        .trim_audit(Some(&one), cutoff, 100_000)
        .await
        .expect("trim_audit");
    assert_eq!(trimmed as usize, ones.len() - 7);
    let kept = audit_of(store.as_ref(), &one).await;
    assert_eq!(kept.len(), 1, "only the entry at the cutoff stays");
    assert_eq!(verify_partition(store.as_ref(), &one, &kept).await, 1);
    assert_eq!(
        audit_of(store.as_ref(), &two).await,
        twos,
        "the other partition is untouched"
    );
    // Leave the shared journal as small as found: both partitions emptied.
    let later = idemgate_core::time::Timestamp::now().saturating_add(Duration::from_secs(60));
    for instance in [&one, &two] {
        store
            .trim_audit(Some(instance), later, 100_000)
            .await
            .expect("trim_audit");
        assert!(audit_of(store.as_ref(), instance).await.is_empty());
    }
}

// --- route execution history (`Store::record_duration`) ----------------------------

/// A route no other test records.
fn fresh_route() -> String {
    format!("POST /conformance/{}", uuid::Uuid::new_v4())
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn history(store: &dyn Store, route: &str) -> Vec<Duration> {
    let mut durations = store.route_durations(route).await.expect("route_durations");
    durations.sort_unstable();
    durations
}

/// A route's history reads back what was recorded, to the microsecond, apart
/// from other routes'; concurrent records (64 tasks at once) all land or
/// replace one another, and the history never holds more than
/// [`idemgate_core::estimate::WINDOW`] durations, each one that was recorded; a route key past
/// [`idemgate_core::estimate::MAX_ROUTE_LEN`] bytes is kept cut at that length.
pub async fn route_history_round_trips_bounded_per_route(store: Arc<dyn Store>) {
    use idemgate_core::estimate::{self, WINDOW};
    let (one, two) = (fresh_route(), fresh_route());
    assert!(history(store.as_ref(), &one).await.is_empty());
    store
        .record_duration(&one, Duration::from_micros(1_234_567))
        .await
        .expect("record_duration");
    store
        .record_duration(&two, ms(7))
        .await
        .expect("record_duration");
    assert_eq!(
        history(store.as_ref(), &one).await,
        [Duration::from_micros(1_234_567)]
    );
    assert_eq!(history(store.as_ref(), &two).await, [ms(7)]);

    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS as u64)
        .map(|n| {
            let (store, route, barrier) = (Arc::clone(&store), one.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store.record_duration(&route, ms(100 + n)).await
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("record task").expect("record_duration");
    }
    for n in 0..WINDOW as u64 {
        store
            .record_duration(&one, ms(1_000 + n))
            .await
            .expect("record_duration");
    }
    let kept = history(store.as_ref(), &one).await;
    assert_eq!(kept.len(), WINDOW, "{kept:?}");
    for duration in &kept {
        let recorded = *duration == Duration::from_micros(1_234_567)
            || (ms(100)..ms(100 + RACERS as u64)).contains(duration)
            || (ms(1_000)..ms(1_000 + WINDOW as u64)).contains(duration);
        assert!(recorded, "{duration:?} was never recorded");
    }
    assert_eq!(history(store.as_ref(), &two).await, [ms(7)]);

    let long = format!("{}/{}", fresh_route(), "é".repeat(estimate::MAX_ROUTE_LEN));
    store
        .record_duration(&long, ms(3))
        .await
        .expect("record_duration");
    assert_eq!(history(store.as_ref(), &long).await, [ms(3)]);
    assert_eq!(
        history(store.as_ref(), estimate::route_key(&long)).await,
        [ms(3)]
    );
}

/// The history is the store's, not an instance's: what `first` recorded,
/// `second` (another instance on the same store, or the same store after a
/// restart) reads, and the other way round. For stores shared between
/// processes; not part of [`crate::store_conformance!`], whose factory may
/// make a new store per call.
pub async fn route_history_is_shared(first: Arc<dyn Store>, second: Arc<dyn Store>) {
    let route = fresh_route();
    first
        .record_duration(&route, ms(250))
        .await
        .expect("record_duration");
    drop(first);
    assert_eq!(history(second.as_ref(), &route).await, [ms(250)]);
    second
        .record_duration(&route, ms(300))
        .await
        .expect("record_duration");
    assert_eq!(history(second.as_ref(), &route).await, [ms(250), ms(300)]);
}

/// At most [`idemgate_core::estimate::MAX_ROUTES`] routes keep history: past that, the least
/// recently recorded make way. Records `MAX_ROUTES + 6` fresh routes (five
/// first, the rest from 16 tasks at once, then one more), after which the
/// first five have no history, the last has, and no more than `MAX_ROUTES` of
/// them do. Evicts other tests' routes on a shared store: not part of
/// [`crate::store_conformance!`], run it on a store of its own.
pub async fn route_history_keeps_a_bounded_number_of_routes(store: Arc<dyn Store>) {
    use idemgate_core::estimate::MAX_ROUTES;
    const TASKS: usize = 16;
    let routes: Vec<String> = (0..MAX_ROUTES + 6).map(|_| fresh_route()).collect();
    let (first, rest) = routes.split_at(5);
    let (last, middle) = rest.split_last().expect("routes");
    for route in first {
        store
            .record_duration(route, ms(1))
            .await
            .expect("record_duration");
    }
    // A store's clock may count milliseconds (SQLite's does): routes recorded
    // in the same millisecond are equally recent, and which of them makes way
    // first is the store's choice. The first five are strictly older.
    tokio::time::sleep(ms(5)).await;
    let chunks: Vec<Vec<String>> = middle
        .chunks(middle.len().div_ceil(TASKS))
        .map(<[String]>::to_vec)
        .collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for route in chunk {
                    store.record_duration(&route, ms(2)).await?;
                }
                Ok::<_, idemgate_core::StoreError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("record task").expect("record_duration");
    }
    tokio::time::sleep(ms(5)).await;
    store
        .record_duration(last, ms(3))
        .await
        .expect("record_duration");
    for route in first {
        assert!(
            history(store.as_ref(), route).await.is_empty(),
            "the least recently recorded route {route} kept its history"
        );
    }
    assert_eq!(history(store.as_ref(), last).await, [ms(3)]);
    let mut kept = 0;
    for route in &routes {
        if !history(store.as_ref(), route).await.is_empty() {
            kept += 1;
        }
    }
    assert!(kept <= MAX_ROUTES, "{kept} routes kept history");
    assert!(
        kept >= MAX_ROUTES - TASKS,
        "only {kept} routes kept history"
    );
}

/// `n` stream pieces of assorted sizes: the empty piece, one byte, a full
/// budget of binary bytes.
fn pieces(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| match i % 3 {
            0 => Bytes::from(format!("id: {i}\ndata: piece {i}\n\n")),
            1 => Bytes::from(
                (0..PIECE_BUDGET)
                    .map(|b| ((b + i) % 256) as u8)
                    .collect::<Vec<_>>(),
            ),
            _ => Bytes::new(),
        })
        .collect()
}

async fn append(store: &dyn Store, lease: &Lease, index: u32, piece: &Bytes) -> FencedWrite {
    store
        .append_stream_piece(lease, index, piece)
        .await
        .expect("append_stream_piece")
}

async fn read(store: &dyn Store, stream: &StreamId, from: u32, limit: u32) -> Vec<Bytes> {
    store
        .read_stream_pieces(stream, from, limit)
        .await
        .expect("read_stream_pieces")
}

/// A run's stream pieces (PROTOCOL §20) come back byte for byte, in order,
/// from any index and in bounded batches, while the run goes on and after its
/// completion (which names them, `InPieces`); a completed record takes no more
/// pieces, and a stream id of another token reads nothing.
pub async fn stream_pieces_round_trip_in_order(store: Arc<dyn Store>) {
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    let stream = lease.stream();
    let sent = pieces(7);
    assert!(read(&*store, &stream, 0, 10).await.is_empty());
    for (index, piece) in sent.iter().enumerate() {
        assert_eq!(
            append(&*store, &lease, index as u32, piece).await,
            FencedWrite::Applied
        );
        let so_far = read(&*store, &stream, 0, 100).await;
        assert_eq!(so_far, sent[..=index], "read after piece {index}");
    }
    assert_eq!(read(&*store, &stream, 2, 3).await, sent[2..5]);
    assert_eq!(read(&*store, &stream, 6, 3).await, sent[6..]);
    assert!(read(&*store, &stream, 7, 3).await.is_empty());
    // Appended again (a write retried): replaced, not doubled.
    assert_eq!(
        append(&*store, &lease, 6, &sent[6]).await,
        FencedWrite::Applied
    );
    assert_eq!(read(&*store, &stream, 0, 100).await, sent);

    let response = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::InPieces(6),
        ..awkward_response()
    };
    assert_eq!(
        store
            .complete(&lease, &completion(response.clone()))
            .await
            .expect("complete"),
        FencedWrite::Applied
    );
    let done = existing(&*store, &request).await;
    assert_eq!(done.record.response(), Some(&response));
    let named = StreamId::of_record(*request.identity.digest(), &done.record);
    assert_eq!(named, stream, "the completed record names its run's stream");
    assert_eq!(read(&*store, &named, 1, 100).await, sent[1..]);
    assert_eq!(
        append(&*store, &lease, 7, &sent[0]).await,
        FencedWrite::Refused,
        "a completed run takes no more pieces"
    );
    assert_eq!(read(&*store, &stream, 0, 100).await, sent);
    let other = StreamId {
        token: FencingToken(stream.token.0.wrapping_add(1)),
        ..stream
    };
    assert!(read(&*store, &other, 0, 100).await.is_empty());
}

/// Pieces are fenced like every write after the claim: a run whose lease was
/// taken over appends nothing, the old run's pieces are not the new run's, and
/// the new run's stream starts empty.
pub async fn stream_pieces_are_the_runs_own(store: Arc<dyn Store>) {
    let request = ClaimRequest {
        lease: Duration::from_millis(300),
        ..fresh_request()
    };
    let first = acquire(&*store, &request).await;
    let sent = pieces(3);
    for (index, piece) in sent.iter().enumerate() {
        assert_eq!(
            append(&*store, &first, index as u32, piece).await,
            FencedWrite::Applied
        );
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = acquire(
        &*store,
        &ClaimRequest {
            lease: LONG,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(second.origin, LeaseOrigin::TakenOver);
    assert_eq!(
        append(&*store, &first, 3, &sent[0]).await,
        FencedWrite::Refused,
        "the run taken over appends nothing"
    );
    assert!(
        read(&*store, &first.stream(), 0, 10).await.is_empty(),
        "the old run's stream is not named by the record any more"
    );
    let new = second.stream();
    assert!(read(&*store, &new, 0, 10).await.is_empty());
    assert_eq!(
        append(&*store, &second, 0, &sent[2]).await,
        FencedWrite::Applied
    );
    assert_eq!(read(&*store, &new, 0, 10).await, [sent[2].clone()]);
}

/// A stream's pieces go with its record: evicted or deleted, nothing is read;
/// the key's next run streams afresh.
pub async fn stream_pieces_go_with_the_record(store: Arc<dyn Store>) {
    let sent = pieces(2);
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    let stream = lease.stream();
    for (index, piece) in sent.iter().enumerate() {
        let _ = append(&*store, &lease, index as u32, piece).await;
    }
    let response = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::InPieces(1),
        ..awkward_response()
    };
    let _ = store
        .complete(&lease, &completion(response))
        .await
        .expect("complete");
    assert!(matches!(
        evict(&*store, request.identity.digest(), EvictMode::UnlessRunning).await,
        Eviction::Evicted { .. }
    ));
    assert!(read(&*store, &stream, 0, 10).await.is_empty());

    let lease = acquire(&*store, &request).await;
    let stream = lease.stream();
    let _ = append(&*store, &lease, 0, &sent[0]).await;
    assert_eq!(
        store.delete(&lease).await.expect("delete"),
        FencedWrite::Applied
    );
    assert!(read(&*store, &stream, 0, 10).await.is_empty());
}

/// A reader of a stream in flight that waits for changes learns of each new
/// piece well before its timeout: appends are announced like completions.
pub async fn appended_pieces_wake_waiters(store: Arc<dyn Store>) {
    let request = fresh_request();
    let lease = acquire(&*store, &request).await;
    let stream = lease.stream();
    let reader = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            loop {
                store
                    .wait_for_change(&stream.identity, Duration::from_secs(10))
                    .await;
                let read = store
                    .read_stream_pieces(&stream, 0, 10)
                    .await
                    .expect("read");
                if !read.is_empty() || start.elapsed() > Duration::from_secs(20) {
                    return start.elapsed();
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = append(&*store, &lease, 0, &Bytes::from_static(b"head")).await;
    let waited = reader.await.expect("reader");
    assert!(
        waited < Duration::from_secs(5),
        "the reader saw the piece only after {waited:?}: appends must wake waiters"
    );
}
