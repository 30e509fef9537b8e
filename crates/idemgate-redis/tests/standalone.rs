//! `RedisStore` on one Redis server (`IDEMGATE_TEST_REDIS_URL`, default
//! `redis://127.0.0.1:6379`): the shared conformance suite, and what only this store
//! promises (key layout, expiry, compression, decoding failures).

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_core::record::{RecordStatus, StoredBody, StoredResponse};
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, FinalStatus, Store, StoreError};
use idemgate_redis::{EvictionPolicy, RedisStore, RedisStoreError};
use idemgate_testkit::fixtures::{awkward_response, fresh_request};
use redis::AsyncCommands;

async fn redis_store() -> RedisStore {
    let url = support::standalone_url();
    RedisStore::connect(&url).await.unwrap_or_else(|err| {
        panic!(
            "Redis at {url} is unreachable or unusable ({err}): start it with `scripts/services.sh redis` \
             or point IDEMGATE_TEST_REDIS_URL at one"
        )
    })
}

/// The conformance suite's key prefix: its own, so what other programs leave
/// on the shared server under the default one (a benchmark's journal of
/// millions of entries, a server's) is never read back by a test that lists
/// the whole journal. The suite leaves its journal empty, route histories are
/// bounded and records expire, so the prefix does not grow from run to run.
const CONFORMANCE_PREFIX: &str = "idemgate-conformance:";

async fn store() -> Arc<dyn Store> {
    let url = support::standalone_url();
    let store = RedisStore::builder()
        .with_key_prefix(CONFORMANCE_PREFIX)
        .connect(&url)
        .await
        .unwrap_or_else(|err| panic!("Redis at {url} is unreachable or unusable ({err})"));
    Arc::new(store)
}

idemgate_testkit::store_conformance!(store);

/// Two connections to one Redis: what one recorded, the other reads, also once
/// the first is gone (a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_is_shared_between_instances() {
    idemgate_testkit::conformance::route_history_is_shared(
        Arc::new(redis_store().await),
        Arc::new(redis_store().await),
    )
    .await;
}

/// Under a key prefix of its own: the bound evicts other tests' routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_keeps_a_bounded_number_of_routes() {
    let url = support::standalone_url();
    let prefix = format!("idemgate-test-{}:", uuid::Uuid::new_v4().simple());
    let store = RedisStore::builder()
        .with_key_prefix(prefix)
        .connect(&url)
        .await
        .expect("connect");
    let (routes, _) = store.duration_keys("POST /x");
    idemgate_testkit::conformance::route_history_keeps_a_bounded_number_of_routes(Arc::new(
        store.clone(),
    ))
    .await;
    let client = redis::Client::open(url.as_str()).expect("client");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let kept: usize = redis::cmd("ZCARD")
        .arg(&routes)
        .query_async(&mut connection)
        .await
        .expect("ZCARD");
    assert_eq!(kept, idemgate_core::estimate::MAX_ROUTES);
    let lists: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", routes.trim_end_matches("routes")))
        .query_async(&mut connection)
        .await
        .expect("KEYS");
    assert_eq!(
        lists.len(),
        idemgate_core::estimate::MAX_ROUTES + 1,
        "the lists and the set"
    );
    // Its prefix is its own: leave nothing of it behind.
    let _: () = redis::cmd("DEL")
        .arg(&lists)
        .query_async(&mut connection)
        .await
        .expect("DEL");
}

// The replay cache in front of the store: the same suite, unchanged.
idemgate_testkit::cached_conformance!(store);

async fn admin() -> redis::aio::MultiplexedConnection {
    redis::Client::open(support::standalone_url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

async fn acquire(store: &RedisStore, request: &ClaimRequest) -> idemgate_core::Lease {
    match store.try_claim(request).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(s) => panic!("expected to acquire, found {:?}", s.record.status()),
    }
}

#[tokio::test]
async fn shared_server_has_the_safe_eviction_policy() {
    assert_eq!(
        redis_store().await.eviction_policy(),
        &EvictionPolicy::NoEviction
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_have_exactly_one_winner() {
    let (a, b) = (redis_store().await, redis_store().await);
    support::two_clients_race(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_on_another_instance_wakes_waiters() {
    let (a, b) = (redis_store().await, redis_store().await);
    support::other_instance_wakes_waiter(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_pieces_are_shared_and_wake_readers_on_another_instance() {
    let (a, b) = (redis_store().await, redis_store().await);
    support::other_instance_reads_and_wakes_on_pieces(&a, &b).await;
}

/// A run's pieces are a list beside its record, in the record's hash tag,
/// expiring with the record: at its claim's expiry while the run goes on, at
/// the completion's after it; gone with the record when it is evicted or
/// deleted. A takeover's run gets a list of its own, the earlier one left to
/// expire.
#[tokio::test]
async fn stream_pieces_are_a_list_per_run_expiring_with_the_record() {
    use idemgate_core::{EvictMode, Eviction};

    let store = redis_store().await;
    let mut admin = admin().await;
    let expiry_admin = admin.clone();
    let pexpiretime = |key: String| {
        let mut admin = expiry_admin.clone();
        async move {
            redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async::<i64>(&mut admin)
                .await
                .unwrap()
        }
    };
    let request = ClaimRequest {
        lease: Duration::from_millis(200),
        ..fresh_request()
    };
    let record = store.record_key(request.identity.digest());
    let lease = acquire(&store, &request).await;
    let stream = lease.stream();
    let pieces = store.stream_pieces_key(&stream);
    assert_eq!(
        pieces,
        format!(
            "{record}:pieces:{}:{}",
            lease.operation_id.as_uuid().simple(),
            lease.token.0
        )
    );
    for index in 0..3 {
        let piece = Bytes::from(vec![index; 10]);
        assert_eq!(
            store
                .append_stream_piece(&lease, u32::from(index), &piece)
                .await
                .unwrap(),
            FencedWrite::Applied
        );
    }
    // A gap (earlier pieces lost, say evicted) is refused as corrupt, and
    // kept nowhere; a piece appended again is replaced.
    assert!(matches!(
        store
            .append_stream_piece(&lease, 5, &Bytes::from_static(b"gap"))
            .await,
        Err(StoreError::Corrupt(_))
    ));
    assert_eq!(
        store
            .append_stream_piece(&lease, 1, &Bytes::from_static(b"again"))
            .await
            .unwrap(),
        FencedWrite::Applied
    );
    let kind: String = redis::cmd("TYPE")
        .arg(&pieces)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(kind, "list");
    let stored: Vec<Vec<u8>> = admin.lrange(&pieces, 0, -1).await.unwrap();
    assert_eq!(stored, [vec![0; 10], b"again".to_vec(), vec![2; 10]]);
    assert_eq!(
        pexpiretime(pieces.clone()).await,
        pexpiretime(record.clone()).await,
        "the pieces expire with the record in progress"
    );
    // A takeover streams into a list of its own; the old one is left to expire.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = acquire(&store, &request).await;
    assert_eq!(second.operation_id, lease.operation_id);
    let second_pieces = store.stream_pieces_key(&second.stream());
    assert_ne!(second_pieces, pieces);
    assert_eq!(
        store
            .append_stream_piece(&second, 0, &Bytes::from_static(b"head"))
            .await
            .unwrap(),
        FencedWrite::Applied
    );
    let old_expiry = pexpiretime(pieces.clone()).await;
    assert!(old_expiry > 0, "the old run's list keeps its expiry");

    let completion = Completion {
        status: FinalStatus::Completed,
        response: StoredResponse {
            trailers: Vec::new(),
            body: StoredBody::InPieces(0),
            ..awkward_response()
        },
        ttl: Duration::from_secs(600_000),
    };
    assert_eq!(
        store.complete(&second, &completion).await.unwrap(),
        FencedWrite::Applied
    );
    let completed_expiry = pexpiretime(record.clone()).await;
    assert_eq!(
        pexpiretime(second_pieces.clone()).await,
        completed_expiry,
        "completion moved the pieces' expiry with the record's"
    );
    assert!(completed_expiry > old_expiry);
    assert_eq!(pexpiretime(pieces.clone()).await, old_expiry);

    assert!(matches!(
        store
            .evict(request.identity.digest(), EvictMode::UnlessRunning)
            .await
            .unwrap(),
        Eviction::Evicted { .. }
    ));
    let exists: i64 = admin.exists(&second_pieces).await.unwrap();
    assert_eq!(exists, 0, "evicted with the record");
    let _: () = admin.del(&pieces).await.unwrap();

    let lease = acquire(&store, &request).await;
    let pieces = store.stream_pieces_key(&lease.stream());
    let _ = store
        .append_stream_piece(&lease, 0, &Bytes::from_static(b"head"))
        .await
        .unwrap();
    let exists: i64 = admin.exists(&pieces).await.unwrap();
    assert_eq!(exists, 1);
    assert_eq!(store.delete(&lease).await.unwrap(), FencedWrite::Applied);
    let exists: i64 = admin.exists(&pieces).await.unwrap();
    assert_eq!(exists, 0, "deleted with the record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_completions_someone_waits_for_are_announced() {
    let (a, b) = (redis_store().await, redis_store().await);
    support::announcements_only_when_waited(&a, &b, &support::standalone_url()).await;
}

#[tokio::test]
async fn one_hash_per_record_under_a_hash_tagged_key_expiring_at_expires_at() {
    let store = redis_store().await;
    let request = fresh_request();
    let key = store.record_key(request.identity.digest());
    assert_eq!(
        key,
        format!("idemgate:{{{}}}", request.identity.digest().to_hex())
    );
    let lease = acquire(&store, &request).await;

    let mut admin = admin().await;
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
    let mut fields: Vec<String> = admin.hkeys(&key).await.unwrap();
    fields.sort();
    assert_eq!(fields, ["ca", "ea", "fp", "lu", "op", "st", "tk", "v"]);
    let op: Vec<u8> = admin.hget(&key, "op").await.unwrap();
    assert_eq!(
        op,
        lease.operation_id.as_bytes(),
        "the operation id is stored as its 16 bytes"
    );
    let expiry: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .unwrap();
    let expires_at: i64 = admin.hget(&key, "ea").await.unwrap();
    assert_eq!(
        expiry, expires_at,
        "the key's expiry is the record's expires_at"
    );
    let locked_until: i64 = admin.hget(&key, "lu").await.unwrap();
    assert_eq!(locked_until, lease.locked_until.as_millis());
    assert!(
        expiry - locked_until > 86_000_000,
        "the key lives for the ttl, not the lease"
    );

    let completion = Completion {
        status: FinalStatus::Completed,
        response: awkward_response(),
        ttl: Duration::from_secs(120),
    };
    assert_eq!(
        store.complete(&lease, &completion).await.unwrap(),
        FencedWrite::Applied
    );
    let snapshot = store.get(request.identity.digest()).await.unwrap().unwrap();
    let expiry: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        expiry,
        snapshot.record.expires_at.as_millis(),
        "completion moved the key's expiry"
    );
    let ttl = snapshot.record.expires_at.duration_since(snapshot.now);
    assert!(
        ttl > Duration::from_secs(110) && ttl <= Duration::from_secs(120),
        "completion + ttl: {ttl:?}"
    );
    let fields: Vec<String> = admin.hkeys(&key).await.unwrap();
    assert!(
        !fields.contains(&"lu".to_owned()),
        "no lease once completed"
    );
}

#[tokio::test]
async fn times_come_from_the_redis_clock() {
    let store = redis_store().await;
    let mut admin = admin().await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
    let before = secs * 1000 + micros / 1000;
    let request = ClaimRequest {
        lease: Duration::from_secs(30),
        ..fresh_request()
    };
    let lease = acquire(&store, &request).await;
    let snapshot = store.get(request.identity.digest()).await.unwrap().unwrap();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
    let after = secs * 1000 + micros / 1000;
    let created = snapshot.record.created_at.as_millis();
    assert!(
        before <= created && created <= after,
        "created_at {created} not within TIME [{before}, {after}]"
    );
    assert!(before <= snapshot.now.as_millis() && snapshot.now.as_millis() <= after);
    assert_eq!(lease.locked_until.as_millis(), created + 30_000);
}

#[tokio::test]
async fn a_lapsed_lease_keeps_the_record_and_its_operation_id() {
    let store = redis_store().await;
    let request = ClaimRequest {
        lease: Duration::from_millis(100),
        ..fresh_request()
    };
    let first = acquire(&store, &request).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let seen = store
        .get(request.identity.digest())
        .await
        .unwrap()
        .expect("a lapsed lease is not an expired key");
    assert_eq!(seen.record.status(), RecordStatus::Processing);
    assert!(!seen.record.lease_is_live(seen.now));
    assert_eq!(seen.record.operation_id, first.operation_id);
}

/// The raw `rs` field of `request`'s record after completing it with `response`
/// on `store`.
async fn stored_response_field(
    store: &RedisStore,
    request: &ClaimRequest,
    response: &StoredResponse,
) -> Vec<u8> {
    let lease = acquire(store, request).await;
    let completion = Completion {
        status: FinalStatus::Completed,
        response: response.clone(),
        ttl: Duration::from_secs(60),
    };
    assert_eq!(
        store.complete(&lease, &completion).await.unwrap(),
        FencedWrite::Applied
    );
    let replayed = store.get(request.identity.digest()).await.unwrap().unwrap();
    assert_eq!(replayed.record.response(), Some(response));
    admin()
        .await
        .hget(store.record_key(request.identity.digest()), "rs")
        .await
        .unwrap()
}

/// By default the store keeps what the layer gives it (the layer compresses
/// large bodies for every store, idemgate_core::compression): one codec, not
/// two. The whole-record codec is an opt-in, and its records read back.
#[tokio::test]
async fn the_layers_codec_is_the_one_and_whole_record_compression_is_opt_in() {
    let body = Bytes::from(br#"{"sku":"SKU-00042","qty":1,"price":"19.99"},"#.repeat(2000));
    let response = StoredResponse {
        trailers: Vec::new(),
        body: StoredBody::Retained(body.clone()),
        ..awkward_response()
    };
    let layered = idemgate_core::compression::compress(response.clone(), 1024);
    let by_default = redis_store().await;
    let stored = stored_response_field(&by_default, &fresh_request(), &layered).await;
    assert_eq!(stored[0], 0, "raw codec tag: the store adds no codec");
    assert!(
        stored.len() < body.len() / 10,
        "the layer's codec kept it small"
    );
    let plain = stored_response_field(&by_default, &fresh_request(), &response).await;
    assert_eq!(plain[0], 0);
    assert!(plain.len() > body.len());

    let opted_in = RedisStore::builder()
        .with_compression_threshold(1024)
        .connect(&support::standalone_url())
        .await
        .unwrap();
    let stored = stored_response_field(&opted_in, &fresh_request(), &response).await;
    assert_eq!(stored[0], 1, "zstd codec tag");
    assert!(
        stored.len() < body.len() / 10,
        "{} bytes stored for a {}-byte body",
        stored.len(),
        body.len()
    );
    // Records written whole-compressed replay on a store that writes raw.
    let request = fresh_request();
    let _ = stored_response_field(&opted_in, &request, &response).await;
    let read = by_default
        .get(request.identity.digest())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.record.response(), Some(&response));
}

#[tokio::test]
async fn undecodable_records_are_corrupt_not_panics() {
    let store = redis_store().await;
    let mut admin = admin().await;
    let garbage = fresh_request();
    let key = store.record_key(garbage.identity.digest());
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("st")
        .arg("Z")
        .arg("op")
        .arg("short")
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = admin.expire(&key, 60).await.unwrap();
    assert!(matches!(
        store.get(garbage.identity.digest()).await,
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        store.try_claim(&garbage).await,
        Err(StoreError::Corrupt(_))
    ));

    let not_a_hash = fresh_request();
    let key = store.record_key(not_a_hash.identity.digest());
    let _: () = admin.set_ex(&key, "a string", 60).await.unwrap();
    assert!(matches!(
        store.try_claim(&not_a_hash).await,
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        store.get(not_a_hash.identity.digest()).await,
        Err(StoreError::Corrupt(_))
    ));
}

#[tokio::test]
async fn prefixes_separate_stores_and_braces_are_refused() {
    let url = support::standalone_url();
    let a = RedisStore::builder()
        .with_key_prefix("idemgate-test-a:")
        .connect(&url)
        .await
        .unwrap();
    let b = RedisStore::builder()
        .with_key_prefix("idemgate-test-b:")
        .connect(&url)
        .await
        .unwrap();
    let request = fresh_request();
    let _ = acquire(&a, &request).await;
    let _ = acquire(&b, &request).await;
    assert!(
        a.record_key(request.identity.digest())
            .starts_with("idemgate-test-a:{")
    );
    let err = RedisStore::builder()
        .with_key_prefix("app:{x}:")
        .connect(&url)
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::InvalidKeyPrefix(_)), "{err}");
}

#[tokio::test]
async fn unreachable_servers_fail_the_constructor_quickly() {
    let port = idemgate_testkit::free_port();
    let start = std::time::Instant::now();
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RedisStoreError::Connect(_) | RedisStoreError::ConnectTimeout(_)
        ),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
}

/// Two processes writing the journal as one instance: each store appends
/// from the heads it last wrote, and must notice the other's entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_appenders_of_one_instance_in_two_processes_keep_one_chain() {
    idemgate_testkit::conformance::audit_appenders_of_one_instance_keep_one_chain(
        store().await,
        store().await,
    )
    .await;
}
