//! The journal through the layer (issue 38): every answer leaves its event, in
//! order, with the operation's scope and a keyed digest of the key, never the
//! key; the chain verifies.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idemgate::audit::{AuditEntry, AuditEvent, AuditQuery, Verifier, key_digest};
use idemgate::journal::{JournalConfig, Journaled};
use idemgate::{IdempotencyLayer, MemoryStore, Store};
use support::{Gateway, ORDER, app, new_key, post_json, send, send_until_charging};

async fn journal(store: &dyn Store, key: &str) -> Vec<AuditEntry> {
    let secret = store.audit_secret().await.unwrap();
    let digest = key_digest(&secret, key);
    store
        .read_audit(&AuditQuery::all(10_000))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.record.key_digest == digest)
        .collect()
}

fn events(entries: &[AuditEntry]) -> Vec<(AuditEvent, Option<u16>)> {
    entries
        .iter()
        .map(|e| (e.record.event(), e.record.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_answer_is_journalled_in_order() {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let journaled = Arc::new(journal_over(Arc::clone(&memory)).await);
    let gateway = Arc::new(Gateway::default());
    gateway.delay_ms.store(300, Ordering::SeqCst);
    let layer = IdempotencyLayer::from_arc(Arc::clone(&journaled) as Arc<dyn Store>);
    let app = app(layer, Arc::clone(&gateway));
    let key = new_key();

    // A first run, a duplicate while it runs (409), its replay, another body (422).
    let first = send_until_charging(
        &app,
        &gateway,
        post_json("/orders", Some("42"), Some(&key), ORDER),
    )
    .await;
    let conflict = send(&app, post_json("/orders", Some("42"), Some(&key), ORDER)).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(first.await.unwrap().status, 201);
    let replay = send(&app, post_json("/orders", Some("42"), Some(&key), ORDER)).await;
    assert_eq!(replay.status, 201);
    let other = send(&app, post_json("/orders", Some("42"), Some(&key), "{}")).await;
    assert_eq!(other.status, 422);
    // A run whose answer is released (a 429 is retryable).
    let released_key = new_key();
    let failed = send(
        &app,
        post_json("/status/429", Some("42"), Some(&released_key), ORDER),
    )
    .await;
    assert_eq!(failed.status, 429);
    journaled.flush().await;
    assert_eq!(gateway.charges(), 2, "the journal changes no outcome");

    let entries = journal(memory.as_ref(), &key).await;
    assert_eq!(
        events(&entries),
        [
            (AuditEvent::Claimed, None),
            (AuditEvent::Conflict, Some(409)),
            (AuditEvent::Executed, Some(201)),
            (AuditEvent::Replayed, Some(201)),
            (AuditEvent::Mismatch, Some(422)),
        ]
    );
    let operation = entries[0].record.operation_id.clone().unwrap();
    for entry in &entries {
        let r = &entry.record;
        assert_eq!(r.operation_id.as_deref(), Some(operation.as_str()));
        assert_eq!((r.method.as_str(), r.route.as_str()), ("POST", "/orders"));
        assert_eq!(r.principal, "user:42");
        assert_eq!(r.instance, "test-instance");
        assert!(!r.key_digest.contains(&key), "never the raw key");
    }
    let executed = &entries[2].record;
    assert!(
        executed.duration_ms.is_some_and(|ms| ms >= 250),
        "the run's duration: {executed:?}"
    );
    assert_eq!(
        events(&journal(memory.as_ref(), &released_key).await),
        [(AuditEvent::Claimed, None), (AuditEvent::Released, None)]
    );

    // The whole journal verifies, and the store holds no key or body.
    let partitions = memory.audit_partitions().await.unwrap();
    let mut verifier = Verifier::new(&partitions);
    for entry in memory.read_audit(&AuditQuery::all(10_000)).await.unwrap() {
        let text = format!("{entry:?}");
        assert!(!text.contains(&key) && !text.contains("RUB"), "{text}");
        verifier.push(&entry).unwrap();
    }
    assert_eq!(verifier.finish().unwrap(), 7);
}

/// A holder whose lease lapsed: the next claim takes over, the old holder's
/// completion is fenced, the new one's executes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_and_the_fenced_holder_are_journalled() {
    use idemgate::{Claim, FencedWrite};
    use idemgate_testkit::fixtures::{awkward_response, completion, fresh_request};

    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let secret = memory.audit_secret().await.unwrap();
    let journaled = Journaled::new(
        Arc::clone(&memory),
        JournalConfig {
            instance: "a".into(),
            secret: secret.clone(),
        },
    );
    let mut request = fresh_request();
    request.lease = Duration::from_millis(100);
    let Claim::Acquired(stale) = journaled.try_claim(&request).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Claim::Acquired(taker) = journaled.try_claim(&request).await.unwrap() else {
        panic!("a lapsed lease is taken over");
    };
    let done = completion(awkward_response());
    assert_eq!(
        journaled.complete(&stale, &done).await.unwrap(),
        FencedWrite::Refused
    );
    assert_eq!(
        journaled.release(&stale).await.unwrap(),
        FencedWrite::Refused
    );
    assert_eq!(
        journaled.complete(&taker, &done).await.unwrap(),
        FencedWrite::Applied
    );
    journaled.flush().await;
    let entries = journal(memory.as_ref(), request.identity.key().as_str()).await;
    assert_eq!(
        events(&entries),
        [
            (AuditEvent::Claimed, None),
            (AuditEvent::TakenOver, None),
            (AuditEvent::Fenced, None),
            (AuditEvent::Executed, Some(201)),
        ],
        "one fenced entry for the stale holder, however many writes it tries"
    );
    assert_eq!(
        key_digest(&secret, request.identity.key().as_str()),
        entries[0].record.key_digest
    );
}

/// A claim returns once its entry is in the journal: the operation is
/// journalled before it runs, and before its run's `executed` entry, which a
/// transactional run appends in its own transaction. On a current-thread
/// runtime the writer runs only while the claim waits for it: without the
/// wait, the entry would still be queued when the claim returns.
#[tokio::test(flavor = "current_thread")]
async fn a_claim_returns_once_its_entry_is_in_the_journal() {
    use idemgate::{Claim, Completion, FinalStatus};
    use idemgate_testkit::fixtures::{awkward_response, fresh_request};

    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let journaled = journal_over(Arc::clone(&memory)).await;
    let Claim::Acquired(lease) = journaled.try_claim(&fresh_request()).await.unwrap() else {
        panic!("a new key is acquired");
    };
    assert_eq!(
        written(memory.as_ref()).await,
        [AuditEvent::Claimed],
        "in the journal when the claim returns"
    );
    let completion = Completion {
        status: FinalStatus::Completed,
        response: awkward_response(),
        ttl: Duration::from_secs(60),
    };
    let entries = journaled
        .transaction_journal_entries(&lease, &completion)
        .await;
    let events: Vec<_> = entries.iter().map(|e| e.event()).collect();
    assert_eq!(
        events,
        [AuditEvent::Executed],
        "the transaction adds only its outcome"
    );
}

/// A journal that stops answering slows claims by the bounded wait, never
/// fails them, and still never shows a run executed before it was claimed:
/// a claim whose entry is still queued when its transaction commits has that
/// entry go into the transaction, before `executed`, and the writer leaves it
/// out; a commit that fails queues it again, before the run's next outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_journal_delays_claims_and_keeps_their_order() {
    use idemgate::{Claim, Completion, FinalStatus};
    use idemgate_testkit::fixtures::{awkward_response, fresh_request};
    use support::FaultyStore;

    let faulty = Arc::new(FaultyStore::default());
    faulty.journal_held.store(true, Ordering::SeqCst);
    let journaled = journal_over(Arc::clone(&faulty) as Arc<dyn Store>).await;
    let completion = Completion {
        status: FinalStatus::Completed,
        response: awkward_response(),
        ttl: Duration::from_secs(60),
    };
    let claim = || async {
        let started = std::time::Instant::now();
        let Claim::Acquired(lease) = journaled.try_claim(&fresh_request()).await.unwrap() else {
            panic!("a new key is acquired");
        };
        let waited = started.elapsed();
        assert!(
            (Duration::from_millis(400)..Duration::from_secs(3)).contains(&waited),
            "a stalled journal delays a claim by the bounded wait: {waited:?}"
        );
        lease
    };

    // The writer is stuck appending the first claim's entry; the second's
    // waits in the queue behind it.
    let stuck = claim().await;
    assert_eq!(faulty.journal_appends.load(Ordering::SeqCst), 1);
    let queued = claim().await;
    let events = |entries: &[idemgate::audit::AuditRecord]| -> Vec<AuditEvent> {
        entries.iter().map(|e| e.event()).collect()
    };
    // Still queued: taken into the transaction, first, in one partition.
    let entries = journaled
        .transaction_journal_entries(&queued, &completion)
        .await;
    assert_eq!(
        events(&entries),
        [AuditEvent::Claimed, AuditEvent::Executed]
    );
    assert_eq!(entries[0].instance, entries[1].instance);
    // ... and that commit fails: the release queues it again, first.
    let _ = journaled.release(&queued).await.unwrap();
    // The writer's own: not the transaction's to add.
    let entries = journaled
        .transaction_journal_entries(&stuck, &completion)
        .await;
    assert_eq!(events(&entries), [AuditEvent::Executed]);

    faulty.journal_held.store(false, Ordering::SeqCst);
    journaled.flush().await;
    assert_eq!(
        written(faulty.as_ref()).await,
        [
            AuditEvent::Claimed,
            AuditEvent::Claimed,
            AuditEvent::Released
        ],
        "the stuck claim's entry, then the failed run's claim and release, each once"
    );
}

/// The writer gathers what nobody waits on (outcomes, replays) for a few
/// milliseconds, asleep: entries queued meanwhile do not wake it. A claim's
/// entry does, so a claim made mid-gathering does not wait it out. On paused
/// time the runtime jumps to the gathering's end only once nothing can run, so
/// the claim's virtual wait is zero when the claim woke the writer and the
/// whole gathering when it did not.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_claim_ends_the_writers_gathering_at_once() {
    use idemgate::Claim;
    use idemgate_testkit::fixtures::{awkward_response, completion, fresh_request};

    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let journaled = journal_over(Arc::clone(&memory)).await;
    let first = fresh_request();
    let Claim::Acquired(lease) = journaled.try_claim(&first).await.unwrap() else {
        panic!("a new key is acquired");
    };
    let _ = journaled
        .complete(&lease, &completion(awkward_response()))
        .await
        .unwrap();
    assert!(matches!(
        journaled.try_claim(&first).await.unwrap(),
        Claim::Existing(_)
    ));
    // The writer takes the outcome and the replay, and starts gathering.
    tokio::task::yield_now().await;

    let start = tokio::time::Instant::now();
    let Claim::Acquired(_) = journaled.try_claim(&fresh_request()).await.unwrap() else {
        panic!("a new key is acquired");
    };
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the claim waited out the writer's gathering"
    );
    assert_eq!(
        written(memory.as_ref()).await,
        [
            AuditEvent::Claimed,
            AuditEvent::Executed,
            AuditEvent::Replayed,
            AuditEvent::Claimed
        ],
        "the gathered entries went with the claim's, in order"
    );
}

/// Business transactions take the instance's transaction chains in turn: as
/// many transactions as there are chains, all open at once, never share one
/// (sharing would make the second wait on the first's head until it commits),
/// and the next one starts the round again. Chosen by the operation's
/// identity, 32 open transactions shared a chain most of the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transactions_take_the_chains_in_turn() {
    use std::collections::HashSet;

    use idemgate::audit::TRANSACTION_PARTITIONS;
    use idemgate::{Claim, Completion, FinalStatus};
    use idemgate_testkit::fixtures::{awkward_response, fresh_request};

    let journaled = Arc::new(journal_over(Arc::new(MemoryStore::new())).await);
    let completion = Arc::new(Completion {
        status: FinalStatus::Completed,
        response: awkward_response(),
        ttl: Duration::from_secs(60),
    });
    let mut leases = Vec::new();
    for _ in 0..=TRANSACTION_PARTITIONS {
        let Claim::Acquired(lease) = journaled.try_claim(&fresh_request()).await.unwrap() else {
            panic!("a new key is acquired");
        };
        leases.push(lease);
    }
    let last = leases.pop().expect("one more than the chains");
    let tasks: Vec<_> = leases
        .into_iter()
        .map(|lease| {
            let journaled = Arc::clone(&journaled);
            let completion = Arc::clone(&completion);
            tokio::spawn(async move {
                let entries = journaled
                    .transaction_journal_entries(&lease, &completion)
                    .await;
                assert_eq!(entries.len(), 1, "the claim's entry is the writer's");
                entries[0].instance.clone()
            })
        })
        .collect();
    let mut chains = HashSet::new();
    for task in tasks {
        chains.insert(task.await.expect("a transaction's entries"));
    }
    assert_eq!(
        chains.len() as u64,
        TRANSACTION_PARTITIONS,
        "one chain each: {chains:?}"
    );
    assert!(
        chains
            .iter()
            .all(|chain| chain.starts_with("test-instance/tx"))
    );
    let next = journaled
        .transaction_journal_entries(&last, &completion)
        .await;
    assert!(chains.contains(&next[0].instance), "the round starts again");
}

/// The journal, as instance `test-instance`, in front of `store`.
async fn journal_over(store: Arc<dyn Store>) -> Journaled {
    let secret = store.audit_secret().await.unwrap();
    Journaled::new(
        store,
        JournalConfig {
            instance: "test-instance".into(),
            secret,
        },
    )
}

async fn written(store: &dyn Store) -> Vec<AuditEvent> {
    store
        .read_audit(&AuditQuery::all(100))
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.record.event())
        .collect()
}
