//! The store conformance suite: what every [`Store`] must do, as plain async
//! functions. [`crate::store_conformance!`] instantiates all of them for one store.
//!
//! Each test makes fresh random identities ([`crate::fixtures`]), so the suite can
//! share one database with other tests and run in parallel. Timing-based tests use leases and TTLs of a few
//! hundred milliseconds and wait well past them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::record::{RecordStatus, StoredBody, StoredResponse};
use idemgate_core::scope::IdentityDigest;
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
        operation_id: idemgate_core::record::OperationId::random(),
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
        body: StoredBody::Retained(Bytes::from(
            (0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )),
        ..awkward_response()
    };
    let empty = StoredResponse {
        body: StoredBody::Retained(Bytes::new()),
        headers: vec![],
        ..awkward_response()
    };
    let not_retained = StoredResponse {
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
