//! Tests that need a Redis server of their own, which each starts (`redis-server` on
//! a free loopback port, killed by PID when its guard drops): the eviction-policy and
//! persistence checks, an outage and recovery, a frozen server, what a restart keeps
//! with and without persistence, AOF across `kill -9`, and a full server.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_core::{
    Claim, ClaimRequest, Completion, FencedWrite, FinalStatus, Lease, Store, StoreError,
};
use idemgate_redis::{
    AppendFsync, EvictionCheck, EvictionPolicy, Persistence, PersistenceCheck, RedisStore,
    RedisStoreError,
};
use idemgate_testkit::fixtures::{awkward_response, fresh_request};
use support::RedisServer;

/// Collects what `tracing` logs while it is the thread's default subscriber.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

async fn acquire(store: &RedisStore, request: &ClaimRequest) -> Lease {
    match store.try_claim(request).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(s) => panic!("expected to acquire, found {:?}", s.record.status()),
    }
}

#[tokio::test]
async fn evicting_policies_are_refused_or_warned_about() {
    let server = RedisServer::start(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();

    let err = RedisStore::connect(&url).await.unwrap_err();
    assert!(
        matches!(&err, RedisStoreError::EvictingPolicy { policy } if policy == "allkeys-lru"),
        "refuse is the default: {err}"
    );
    let err = RedisStore::builder()
        .with_eviction_check(EvictionCheck::Refuse)
        .connect(&url)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedisStoreError::EvictingPolicy { .. }),
        "{err}"
    );

    let (logs, _guard) = Logs::capture();
    let store = RedisStore::builder()
        .with_eviction_check(EvictionCheck::Warn)
        .connect(&url)
        .await
        .unwrap();
    assert_eq!(
        store.eviction_policy(),
        &EvictionPolicy::Evicting("allkeys-lru".into())
    );
    let logged = logs.text();
    assert!(
        logged.contains("WARN") && logged.contains("maxmemory_policy=allkeys-lru"),
        "logged: {logged}"
    );
    assert!(
        matches!(
            store.try_claim(&fresh_request()).await.unwrap(),
            Claim::Acquired(_)
        ),
        "warn mode works on"
    );

    // volatile-* evicts exactly the keys with an expiry: every record.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-ttl")
        .query(&mut server.admin())
        .unwrap();
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert!(
        matches!(&err, RedisStoreError::EvictingPolicy { policy } if policy == "volatile-ttl"),
        "{err}"
    );

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut server.admin())
        .unwrap();
    let store = RedisStore::connect(&url).await.unwrap();
    assert_eq!(store.eviction_policy(), &EvictionPolicy::NoEviction);
}

#[tokio::test]
async fn an_unreadable_policy_is_a_warning_in_both_modes() {
    let server = RedisServer::start(&["--maxmemory-policy", "allkeys-lru"]);
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-config",
        ])
        .query(&mut server.admin())
        .unwrap();
    let url = server.url().replace("redis://", "redis://app:secret@");
    for check in [EvictionCheck::Refuse, EvictionCheck::Warn] {
        let (logs, _guard) = Logs::capture();
        let store = RedisStore::builder()
            .with_eviction_check(check)
            .connect(&url)
            .await
            .unwrap();
        assert_eq!(store.eviction_policy(), &EvictionPolicy::Unknown);
        let logged = logs.text();
        assert!(
            logged.contains("WARN") && logged.contains("maxmemory_policy=\"unknown\""),
            "logged: {logged}"
        );
        assert!(matches!(
            store.try_claim(&fresh_request()).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
}

#[tokio::test]
async fn no_persistence_is_warned_about_by_default_and_refused_on_request() {
    let server = RedisServer::start(&["--save", "", "--appendonly", "no"]);
    let url = server.url();

    let (logs, guard) = Logs::capture();
    let store = RedisStore::connect(&url).await.unwrap();
    drop(guard);
    assert_eq!(store.persistence(), &Persistence::None);
    let logged = logs.text();
    let warnings: Vec<&str> = logged
        .lines()
        .filter(|line| line.contains("persistence=\"none\""))
        .collect();
    assert_eq!(warnings.len(), 1, "one loud warning: {logged}");
    assert!(
        warnings[0].contains("WARN")
            && warnings[0].contains("runs again")
            && warnings[0].contains("appendonly yes"),
        "the warning names the risk and the fix: {logged}"
    );
    assert!(
        matches!(
            store.try_claim(&fresh_request()).await.unwrap(),
            Claim::Acquired(_)
        ),
        "warn mode works on"
    );

    let err = RedisStore::builder()
        .with_persistence_check(PersistenceCheck::Refuse)
        .connect(&url)
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::NoPersistence), "{err}");

    // Snapshots are persistence (lossy, documented): accepted under Refuse.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("save")
        .arg("3600 1")
        .query(&mut server.admin())
        .unwrap();
    let store = RedisStore::builder()
        .with_persistence_check(PersistenceCheck::Refuse)
        .connect(&url)
        .await
        .unwrap();
    assert_eq!(
        store.persistence(),
        &Persistence::Snapshots {
            save: "3600 1".into()
        }
    );
}

#[tokio::test]
async fn an_append_only_server_passes_both_persistence_checks_silently() {
    let server = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    for check in [PersistenceCheck::Warn, PersistenceCheck::Refuse] {
        let (logs, _guard) = Logs::capture();
        let store = RedisStore::builder()
            .with_persistence_check(check)
            .connect(&server.url())
            .await
            .unwrap();
        assert_eq!(
            store.persistence(),
            &Persistence::AppendOnly {
                fsync: AppendFsync::Always
            }
        );
        let logged = logs.text();
        assert!(
            !logged.contains("persistence"),
            "{check:?} logged: {logged}"
        );
        let lease = acquire(&store, &fresh_request()).await;
        assert_eq!(
            store.complete(&lease, &completion()).await.unwrap(),
            FencedWrite::Applied
        );
    }
}

#[tokio::test]
async fn unreadable_persistence_is_a_warning_or_a_refusal_by_policy() {
    let server = RedisServer::start(&["--appendonly", "yes"]);
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-config",
        ])
        .query(&mut server.admin())
        .unwrap();
    let url = server.url().replace("redis://", "redis://app:secret@");

    let (logs, guard) = Logs::capture();
    let store = RedisStore::builder()
        .with_eviction_check(EvictionCheck::Warn)
        .with_persistence_check(PersistenceCheck::Warn)
        .connect(&url)
        .await
        .unwrap();
    drop(guard);
    assert_eq!(store.persistence(), &Persistence::Unknown);
    let logged = logs.text();
    assert!(
        logged.contains("WARN") && logged.contains("persistence=\"unknown\""),
        "logged: {logged}"
    );
    assert!(matches!(
        store.try_claim(&fresh_request()).await.unwrap(),
        Claim::Acquired(_)
    ));

    let err = RedisStore::builder()
        .with_eviction_check(EvictionCheck::Warn)
        .with_persistence_check(PersistenceCheck::Refuse)
        .connect(&url)
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::PersistenceUnknown), "{err}");
}

fn completion() -> Completion {
    Completion {
        status: FinalStatus::Completed,
        response: awkward_response(),
        ttl: Duration::from_secs(3_600),
    }
}

/// Completes a fresh key, kills the server with `kill -9`, restarts it, and claims
/// the key again once the server answers.
async fn claim_after_a_restart(server: &mut RedisServer) -> Claim {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    assert_eq!(
        store.complete(&lease, &completion()).await.unwrap(),
        FencedWrite::Applied
    );
    assert!(matches!(
        store.try_claim(&request).await.unwrap(),
        Claim::Existing(_)
    ));
    server.kill();
    server.restart();
    let start = Instant::now();
    loop {
        match store.try_claim(&request).await {
            Ok(claim) => return claim,
            Err(StoreError::Unavailable(_)) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("no recovery after the restart: {err:?}"),
        }
    }
}

/// The hazard the persistence check warns about, shown: without persistence a
/// restart forgets a completed key, whose retry then runs as a new operation; with
/// AOF `appendfsync always` the same retry replays the stored response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_completed_keys_without_persistence_and_keeps_them_with_aof() {
    let mut forgetful = RedisServer::start(&["--save", "", "--appendonly", "no"]);
    match claim_after_a_restart(&mut forgetful).await {
        Claim::Acquired(lease) => assert_eq!(
            lease.origin,
            idemgate_core::LeaseOrigin::New,
            "the completed key is claimable as a new operation: it would run again"
        ),
        Claim::Existing(s) => panic!(
            "a server without persistence kept the record ({:?})?",
            s.record.status()
        ),
    }

    let mut durable = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    match claim_after_a_restart(&mut durable).await {
        Claim::Existing(snapshot) => {
            assert!(snapshot.record.status().is_final());
            assert_eq!(snapshot.record.response(), Some(&awkward_response()));
        }
        Claim::Acquired(_) => panic!("AOF always lost a completed record across kill -9"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_gives_prompt_errors_and_the_store_recovers() {
    let mut server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let lease = acquire(&store, &fresh_request()).await;

    server.kill();
    // Default timeouts: every call fails within response (1 s) + connect (0.5 s).
    let bound = Duration::from_millis(2_000);
    for attempt in 0..4 {
        let start = Instant::now();
        let err = store.try_claim(&fresh_request()).await.unwrap_err();
        let took = start.elapsed();
        eprintln!("attempt {attempt} while down: {err} after {took:?}");
        assert!(
            matches!(err, StoreError::Unavailable(_)),
            "attempt {attempt}: {err:?}"
        );
        assert!(took < bound, "attempt {attempt} took {took:?}");
    }
    let start = Instant::now();
    let completion = Completion {
        status: FinalStatus::Completed,
        response: awkward_response(),
        ttl: Duration::from_secs(60),
    };
    assert!(matches!(
        store.complete(&lease, &completion).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.get(&lease.identity).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(start.elapsed() < bound * 2);

    server.restart();
    let start = Instant::now();
    let request = fresh_request();
    loop {
        match store.try_claim(&request).await {
            Ok(Claim::Acquired(_)) => break,
            Ok(Claim::Existing(s)) => {
                panic!("fresh identity found existing: {:?}", s.record.status())
            }
            Err(StoreError::Unavailable(_)) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!(
                "the store did not recover within {:?}: {err:?}",
                start.elapsed()
            ),
        }
    }
    eprintln!("recovered {:?} after the restart", start.elapsed());
    assert!(matches!(
        store.try_claim(&request).await.unwrap(),
        Claim::Existing(_)
    ));
}

/// Every operation on a frozen server (SIGSTOP: connections are accepted by the
/// kernel, nothing answers) fails with `Unavailable` within its deadline — the
/// response plus the connect timeout — never hangs; a constructor fails too; and
/// after SIGCONT the same store works again, the lease taken before the freeze
/// included. `Drop` resumes and kills the server on every exit path.
async fn frozen_server_operations_time_out_and_recover(
    builder: impl Fn() -> idemgate_redis::RedisStoreBuilder,
    deadline: Duration,
) {
    let server = RedisServer::start(&[]);
    let store = builder().connect(&server.url()).await.unwrap();
    let request = fresh_request();
    let lease = acquire(&store, &request).await;
    let bound = deadline + Duration::from_secs(1);

    server.pause(true);
    type Call<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;
    let calls: Vec<(&str, Call<'_>)> = vec![
        (
            "claim",
            Box::pin(async { store.try_claim(&fresh_request()).await.map(drop) }),
        ),
        (
            "complete",
            Box::pin(async { store.complete(&lease, &completion()).await.map(drop) }),
        ),
        (
            "renew",
            Box::pin(async { store.renew(&lease, Duration::from_secs(30)).await.map(drop) }),
        ),
        (
            "release",
            Box::pin(async { store.release(&lease).await.map(drop) }),
        ),
        (
            "delete",
            Box::pin(async { store.delete(&lease).await.map(drop) }),
        ),
        (
            "get",
            Box::pin(async { store.get(&lease.identity).await.map(drop) }),
        ),
    ];
    for (operation, call) in calls {
        let started = Instant::now();
        let result = call.await;
        let took = started.elapsed();
        eprintln!("{operation} while frozen: {result:?} after {took:?}");
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
            "{operation}: {result:?}"
        );
        assert!(
            took < bound,
            "{operation} took {took:?}, deadline {deadline:?}"
        );
    }
    let connecting = Instant::now();
    let err = builder().connect(&server.url()).await.unwrap_err();
    let took = connecting.elapsed();
    eprintln!("connect while frozen: {err} after {took:?}");
    assert!(
        matches!(
            err,
            RedisStoreError::Connect(_) | RedisStoreError::ConnectTimeout(_)
        ),
        "{err:?}"
    );
    assert!(took < deadline * 3 + bound, "connecting took {took:?}");

    server.pause(false);
    let resumed = Instant::now();
    let after = fresh_request();
    let lease = loop {
        match store.try_claim(&after).await {
            Ok(Claim::Acquired(lease)) => break lease,
            Ok(Claim::Existing(s)) => panic!("fresh identity found {:?}", s.record.status()),
            Err(StoreError::Unavailable(_)) if resumed.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("no recovery after SIGCONT: {err:?}"),
        }
    };
    eprintln!("recovered {:?} after SIGCONT", resumed.elapsed());
    assert_eq!(
        store.complete(&lease, &completion()).await.unwrap(),
        FencedWrite::Applied
    );
    assert!(matches!(
        store.try_claim(&after).await.unwrap(),
        Claim::Existing(s) if s.record.response() == Some(&awkward_response())
    ));
    // The calls that timed out may have run once Redis resumed (a timeout says
    // nothing about the server side); whatever they did, the record reads back.
    store.get(request.identity.digest()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_gives_timeouts_not_hangs_with_the_default_timeouts() {
    // Defaults: 1 s response + 500 ms connect.
    frozen_server_operations_time_out_and_recover(
        RedisStore::builder,
        Duration::from_millis(1_500),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_gives_timeouts_within_configured_timeouts() {
    frozen_server_operations_time_out_and_recover(
        || {
            RedisStore::builder()
                .with_response_timeout(Duration::from_millis(300))
                .with_connect_timeout(Duration::from_millis(200))
        },
        Duration::from_millis(500),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aof_always_keeps_every_record_across_kill_9() {
    let mut server = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let store = RedisStore::connect(&server.url()).await.unwrap();

    let completed = fresh_request();
    let lease = acquire(&store, &completed).await;
    let large = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::Retained(Bytes::from(
            br#"{"line":"compressed on the way in"},"#.repeat(500),
        )),
        ..awkward_response()
    };
    for (request, response) in [(&completed, awkward_response()), (&fresh_request(), large)] {
        let lease = if std::ptr::eq(request, &completed) {
            lease.clone()
        } else {
            acquire(&store, request).await
        };
        let completion = Completion {
            status: FinalStatus::Completed,
            response,
            ttl: Duration::from_secs(3_600),
        };
        assert_eq!(
            store.complete(&lease, &completion).await.unwrap(),
            FencedWrite::Applied
        );
    }
    let released = fresh_request();
    let released_lease = acquire(&store, &released).await;
    assert_eq!(
        store.release(&released_lease).await.unwrap(),
        FencedWrite::Applied
    );
    let processing = fresh_request();
    let _ = acquire(&store, &processing).await;

    let mut before = Vec::new();
    for request in [&completed, &released, &processing] {
        before.push(
            store
                .get(request.identity.digest())
                .await
                .unwrap()
                .expect("record")
                .record,
        );
    }

    server.kill(); // SIGKILL: no shutdown, no final fsync
    server.restart();

    let start = Instant::now();
    let first = loop {
        match store.get(completed.identity.digest()).await {
            Ok(snapshot) => break snapshot,
            Err(StoreError::Unavailable(_)) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("no record after restart: {err:?}"),
        }
    };
    assert_eq!(
        first
            .expect("completed record replayed from the AOF")
            .record,
        before[0]
    );
    for (request, record) in [(&released, &before[1]), (&processing, &before[2])] {
        let after = store
            .get(request.identity.digest())
            .await
            .unwrap()
            .expect("record replayed from the AOF");
        assert_eq!(&after.record, record);
    }
    let snapshot = match store.try_claim(&completed).await.unwrap() {
        Claim::Existing(snapshot) => snapshot,
        Claim::Acquired(_) => panic!("a completed record was lost"),
    };
    assert_eq!(snapshot.record.response(), Some(&awkward_response()));
    let key = store.record_key(completed.identity.digest());
    let expiry: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(
        expiry,
        before[0].expires_at.as_millis(),
        "the key's expiry survived too"
    );
}

#[tokio::test]
async fn a_full_server_refuses_new_records_and_keeps_the_old_ones() {
    let server = RedisServer::start(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let store = RedisStore::builder()
        .with_compression_threshold(usize::MAX)
        .connect(&server.url())
        .await
        .unwrap();
    let noise: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let response = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::Retained(noise.into()),
        ..awkward_response()
    };
    let mut kept = Vec::new();
    let full = loop {
        assert!(kept.len() < 100, "3 MiB never filled up");
        let request = fresh_request();
        let lease = match store.try_claim(&request).await {
            Ok(Claim::Acquired(lease)) => lease,
            Ok(Claim::Existing(_)) => panic!("fresh identity found existing"),
            Err(err) => break err,
        };
        let completion = Completion {
            status: FinalStatus::Completed,
            response: response.clone(),
            ttl: Duration::from_secs(600),
        };
        match store.complete(&lease, &completion).await {
            Ok(FencedWrite::Applied) => kept.push(request),
            Ok(FencedWrite::Refused) => panic!("refused"),
            Err(err) => break err,
        }
    };
    assert!(
        matches!(full, StoreError::Full),
        "a full noeviction server answers OOM: {full:?}"
    );
    assert!(!kept.is_empty());
    for request in &kept {
        assert!(
            store
                .get(request.identity.digest())
                .await
                .unwrap()
                .is_some(),
            "a record was evicted"
        );
    }
}

/// Waits until the primary at `primary` reports `count` connected, caught-up replicas.
fn wait_for_replicas(primary: &RedisServer, count: usize) {
    let start = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut primary.admin())
            .unwrap();
        let online = info.matches("state=online").count();
        if online >= count {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{online} of {count} replicas online after 10 s: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_replication_wait_an_unreplicated_claim_is_released_and_never_acquired() {
    let primary = RedisServer::start(&[]);
    // Generous: the replica phase below must not fall short on a loaded machine.
    let waiting = RedisStore::builder()
        .with_response_timeout(Duration::from_secs(3))
        .with_replication_wait(1, Duration::from_secs(1))
        .connect(&primary.url())
        .await
        .unwrap();
    let plain = RedisStore::connect(&primary.url()).await.unwrap();

    // No replica at all: the claim cannot reach one, so it must not be acquired.
    let request = fresh_request();
    for _ in 0..2 {
        let err = waiting.try_claim(&request).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(cause)
                if matches!(cause.downcast_ref::<RedisStoreError>(),
                    Some(RedisStoreError::NotReplicated { acknowledged: 0, wanted: 1 }))),
            "{err:?}"
        );
    }
    // It was released, not left in progress: the next claim takes it at once.
    match plain.try_claim(&request).await.unwrap() {
        Claim::Acquired(lease) => {
            assert_eq!(lease.origin, idemgate_core::LeaseOrigin::Released);
            assert_eq!(plain.release(&lease).await.unwrap(), FencedWrite::Applied);
        }
        Claim::Existing(s) => panic!("left behind as {:?}", s.record.status()),
    }
    // A claim that finds a record writes nothing and is answered as usual.
    let done = fresh_request();
    let lease = acquire(&plain, &done).await;
    assert_eq!(
        plain.complete(&lease, &completion()).await.unwrap(),
        FencedWrite::Applied
    );
    assert!(matches!(
        waiting.try_claim(&done).await.unwrap(),
        Claim::Existing(_)
    ));

    // A claim that carried its journal entry (one server) and is released
    // for want of a replica is followed by `released` in the journal.
    let mut template = idemgate_testkit::conformance::audit_record(
        "host-r",
        idemgate_core::audit::AuditEvent::Claimed,
        2,
    );
    (template.event, template.operation_id, template.status) = (None, None, None);
    let (found, _) = waiting
        .try_claim_journaled(&done, &template)
        .await
        .expect("a claim that finds a record waits for nothing");
    assert!(matches!(found, Claim::Existing(_)), "and reads the clock");
    waiting
        .try_claim_journaled(&fresh_request(), &template)
        .await
        .expect_err("not replicated");
    let journal = waiting
        .read_audit(&idemgate_core::audit::AuditQuery::all(10))
        .await
        .expect("read_audit");
    let events: Vec<_> = journal
        .iter()
        .map(|e| (e.record.event(), e.record.instance.as_str()))
        .collect();
    use idemgate_core::audit::AuditEvent::{Claimed, Released};
    assert_eq!(events, [(Claimed, "host-r/claim0"), (Released, "host-r")]);
    assert_eq!(
        journal[0].record.operation_id,
        journal[1].record.operation_id
    );

    // With a replica, every acknowledged write is on the replica when the call returns.
    let port = primary.url().rsplit(':').next().unwrap().to_owned();
    let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
    wait_for_replicas(&primary, 1);
    type Fields = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;
    let on_replica = |key: &str| -> Fields {
        redis::cmd("HGETALL")
            .arg(key)
            .query(&mut replica.admin())
            .unwrap()
    };
    let lease = match waiting.try_claim(&request).await.unwrap() {
        Claim::Acquired(lease) => lease,
        Claim::Existing(s) => panic!("found {:?}", s.record.status()),
    };
    let key = waiting.record_key(request.identity.digest());
    let claimed = on_replica(&key);
    assert!(!claimed.is_empty(), "the claim is not on the replica");
    assert_eq!(
        waiting
            .renew(&lease, Duration::from_secs(30))
            .await
            .unwrap(),
        FencedWrite::Applied
    );
    assert_eq!(
        waiting.complete(&lease, &completion()).await.unwrap(),
        FencedWrite::Applied
    );
    let primary_record: Fields = redis::cmd("HGETALL")
        .arg(&key)
        .query(&mut primary.admin())
        .unwrap();
    assert_eq!(
        on_replica(&key),
        primary_record,
        "the completed record is on the replica as on the primary"
    );
    assert!(matches!(
        plain.try_claim(&request).await.unwrap(),
        Claim::Existing(s) if s.record.response() == Some(&awkward_response())
    ));

    let err = RedisStore::builder()
        .with_response_timeout(Duration::from_millis(500))
        .with_replication_wait(1, Duration::from_millis(500))
        .connect(&primary.url())
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedisStoreError::ReplicationWaitTooLong { .. }),
        "{err}"
    );
}

/// `EVALSHA` calls the server has run since its statistics were last reset.
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.admin())
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .map_or(0, |rest| {
            rest.split(',')
                .next()
                .and_then(|calls| calls.parse().ok())
                .expect("a count of calls")
        })
}

fn reset_statistics(server: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.admin())
        .expect("CONFIG RESETSTAT");
}

/// A journal append is one round trip, the compare-and-set, once the store
/// knows the heads it wrote and the server's clock; it reads them again only
/// when the clock estimate is old or another process moved a head (counted
/// in a server of our own: `INFO commandstats`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_append_is_one_round_trip_while_the_heads_are_known() {
    use idemgate_core::audit::AuditEvent;
    use idemgate_testkit::conformance::{audit_of, audit_record, verify_partition};
    let server = RedisServer::start(&["--save", "", "--appendonly", "no"]);
    let one = RedisStore::connect(&server.url()).await.expect("connect");
    let append = |store: &RedisStore| {
        let store = store.clone();
        let batch = [
            audit_record("host-a", AuditEvent::Replayed, 1),
            audit_record("host-a", AuditEvent::Conflict, 2),
        ];
        async move { store.append_audit(&batch).await.expect("append_audit") }
    };
    append(&one).await; // loads the scripts, reads the heads
    reset_statistics(&server);
    for _ in 0..3 {
        append(&one).await;
    }
    assert_eq!(
        script_calls(&server),
        3,
        "three appends, one script call each"
    );

    // Another process writes as the same instance: the first's next append
    // is refused, reads the heads again and appends (three calls), and the
    // one after is one call again.
    let two = RedisStore::connect(&server.url()).await.expect("connect");
    append(&two).await;
    reset_statistics(&server);
    append(&one).await;
    assert_eq!(script_calls(&server), 3, "refused, read, appended");
    append(&one).await;
    assert_eq!(script_calls(&server), 4);

    // Past the clock's trust, the clock is read again with the heads.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    append(&one).await;
    assert_eq!(script_calls(&server), 6, "read, appended");

    let entries = audit_of(&one, "host-a").await;
    assert_eq!(entries.len(), 2 * 8, "every entry");
    assert_eq!(verify_partition(&one, "host-a", &entries).await, 16);
}

/// On one server a new key's claim carries its journal entry: one script
/// call writes the record and appends `claimed` on one of the instance's
/// claim chains (`{instance}/claimN`, taken in turn), so the claim does not
/// wait for the journal's writer. Counted in a server of our own. A claim
/// that finds a record writes nothing; a chain whose head another process
/// moved gets its entry from the writer once and is learned from the reply;
/// concurrent claims each carry their entry on a chain of their own; every
/// chain verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_keys_claim_carries_its_journal_entry_in_one_round_trip() {
    use idemgate_core::LeaseOrigin;
    use idemgate_core::audit::{AuditEvent, AuditRecord, CLAIM_PARTITIONS, claim_partition};
    use idemgate_testkit::conformance::{audit_of, audit_record, verify_partition};

    let server = RedisServer::start(&["--save", "", "--appendonly", "no"]);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let template = AuditRecord {
        event: None,
        operation_id: None,
        method: "POST".into(),
        route: "/orders".into(),
        principal: "bearer:alice".into(),
        key_digest: "ab".repeat(32),
        fingerprint: Some("cd".repeat(32)),
        status: None,
        duration_ms: None,
        instance: "host-c".into(),
    };
    let claim = |request: ClaimRequest| {
        let (store, template) = (store.clone(), template.clone());
        async move {
            match store.try_claim_journaled(&request, &template).await {
                Ok((Claim::Acquired(lease), written)) => (lease, written),
                other => panic!("a fresh key is acquired: {other:?}"),
            }
        }
    };
    // The chains' entries, by chain, each verified whole.
    let chains = |store: RedisStore| async move {
        let mut all = Vec::new();
        for n in 0..CLAIM_PARTITIONS {
            let chain = claim_partition("host-c", n);
            let entries = audit_of(&store, &chain).await;
            if !entries.is_empty() {
                verify_partition(&store, &chain, &entries).await;
                all.extend(entries);
            }
        }
        all.sort_by_key(|e| e.seq);
        all
    };

    // An idle store's first claim has not read the server's clock: its entry
    // is left to the writer. It loads the script, too.
    let (_, written) = claim(fresh_request()).await;
    assert!(!written, "no clock reading yet: the writer appends it");

    reset_statistics(&server);
    let mut leases = Vec::new();
    for _ in 0..5 {
        let (lease, written) = claim(fresh_request()).await;
        assert!(written, "the entry went with the claim");
        leases.push(lease);
    }
    assert_eq!(script_calls(&server), 5, "one script call per claim");
    let entries = chains(store.clone()).await;
    assert_eq!(entries.len(), 5);
    for (n, (entry, lease)) in entries.iter().zip(&leases).enumerate() {
        assert_eq!(entry.record.instance, claim_partition("host-c", n as u64));
        assert_eq!(
            entry.record,
            AuditRecord {
                event: Some(AuditEvent::Claimed),
                operation_id: Some(lease.operation_id.to_string()),
                instance: entry.record.instance.clone(),
                ..template.clone()
            },
            "the claim's entry, under the operation the claim created"
        );
    }

    // A claim that finds the record (held, then lapsed and taken over)
    // appends nothing: a takeover's entry is the writer's.
    let held = ClaimRequest {
        lease: Duration::from_millis(100),
        ..fresh_request()
    };
    let (_, written) = claim(held.clone()).await;
    assert!(written);
    let (again, written) = store
        .try_claim_journaled(&held, &template)
        .await
        .expect("claim");
    assert!(matches!(again, Claim::Existing(_)) && !written);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (taken, written) = claim(held).await;
    assert_eq!(taken.origin, LeaseOrigin::TakenOver);
    assert!(!written, "a takeover leaves its entry to the writer");
    assert_eq!(chains(store.clone()).await.len(), 6);

    // Another process moves the next chain's head: that claim's entry is
    // refused (the writer's then), the head is learned, and the chain's next
    // turn carries its entry again.
    let next = claim_partition("host-c", 8);
    let other = RedisStore::connect(&server.url()).await.expect("connect");
    other
        .append_audit(&[audit_record(&next, AuditEvent::Replayed, 1)])
        .await
        .expect("append");
    let (_, written) = claim(fresh_request()).await;
    assert!(!written, "the chain's head moved under it");
    for turn in 9..CLAIM_PARTITIONS + 8 {
        let (_, written) = claim(fresh_request()).await;
        assert!(written, "turn {turn}");
    }
    let (_, written) = claim(fresh_request()).await;
    assert!(written, "the moved chain, learned, carries its entry again");
    assert_eq!(
        audit_of(&store, &next).await.len(),
        2,
        "the replay, one claim"
    );

    // Concurrent claims: each carries its entry on a chain of its own. (The
    // reads take a while: one claim reads the clock again first.)
    let before = chains(store.clone()).await.len();
    let (_, warm_up) = claim(fresh_request()).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (barrier, store, template) =
                (Arc::clone(&barrier), store.clone(), template.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let (claim, written) = store
                    .try_claim_journaled(&fresh_request(), &template)
                    .await
                    .expect("claim");
                assert!(matches!(claim, Claim::Acquired(_)));
                written
            })
        })
        .collect();
    let mut written = 0;
    for task in tasks {
        written += usize::from(task.await.expect("task"));
    }
    assert_eq!(written, 64, "64 claims on 128 chains never share one");
    let after = chains(store.clone()).await;
    assert_eq!(
        after.len(),
        before + usize::from(warm_up) + 64,
        "one entry per claim, all chains verify"
    );
}

/// The journal is read merged by `seq` across its streams, however many and
/// however uneven: three partitions' interleaved entries (one with most of
/// them, each past the script's 64-entry reads) come back whole and in
/// order, in one read and page by page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_reads_merged_by_seq_across_its_streams() {
    use idemgate_core::audit::{AuditEvent, AuditQuery};
    use idemgate_testkit::conformance::audit_record;
    let server = RedisServer::start(&["--save", "", "--appendonly", "no"]);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    for round in 0..100u16 {
        let mut batch = vec![
            audit_record("main", AuditEvent::Replayed, round),
            audit_record("main", AuditEvent::Conflict, round),
        ];
        if round % 3 == 0 {
            batch.push(audit_record("main/claim1", AuditEvent::Claimed, round));
        }
        batch.push(audit_record("other", AuditEvent::Mismatch, round));
        store.append_audit(&batch).await.expect("append");
    }
    let whole = store
        .read_audit(&AuditQuery::all(10_000))
        .await
        .expect("read_audit");
    assert_eq!(whole.len(), 334);
    let seqs: Vec<u64> = whole.iter().map(|e| e.seq).collect();
    let first = seqs[0];
    assert_eq!(
        seqs,
        (first..first + 334).collect::<Vec<_>>(),
        "every entry, in seq order"
    );
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .read_audit(&AuditQuery {
                after,
                ..AuditQuery::all(100)
            })
            .await
            .expect("read_audit");
        let Some(last) = page.last() else { break };
        after = Some(last.seq);
        paged.extend(page);
    }
    assert_eq!(paged, whole, "page by page, the same entries");
}
