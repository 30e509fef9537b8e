//! `RedisStore` on a real three-primary Redis Cluster (`IDEMGATE_TEST_REDIS_CLUSTER_URLS`,
//! started by `scripts/test.sh` through `scripts/redis-cluster.sh`): the same
//! conformance suite as on one server (directly and behind the replay cache), plus races between two clients and the key
//! layout's spread over the slots. Without the variable every test here fails.

mod support;

use std::collections::HashSet;
use std::sync::Arc;

use idemgate_core::{Claim, Store};
use idemgate_redis::{EvictionPolicy, Persistence, PersistenceCheck, RedisStore, RedisStoreError};
use idemgate_testkit::fixtures::fresh_request;

async fn cluster_store() -> RedisStore {
    let urls = support::cluster_urls();
    RedisStore::connect_cluster(&urls).await.unwrap_or_else(|err| {
        panic!("Redis Cluster at {urls:?} is unreachable ({err}): run scripts/test.sh, which starts it")
    })
}

async fn store() -> Arc<dyn Store> {
    Arc::new(cluster_store().await)
}

idemgate_testkit::store_conformance!(store);

// The replay cache in front of the store: the same suite, unchanged.
idemgate_testkit::cached_conformance!(store);

#[tokio::test]
async fn every_primary_is_checked_for_its_eviction_policy_and_persistence() {
    let store = cluster_store().await;
    assert!(store.is_cluster());
    assert_eq!(store.eviction_policy(), &EvictionPolicy::NoEviction);
    // scripts/redis-cluster.sh starts its nodes with `--save "" --appendonly no`.
    assert_eq!(store.persistence(), &Persistence::None);
    let err = RedisStore::builder()
        .with_persistence_check(PersistenceCheck::Refuse)
        .connect_cluster(support::cluster_urls())
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::NoPersistence), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_have_exactly_one_winner() {
    let (a, b) = (cluster_store().await, cluster_store().await);
    for _ in 0..3 {
        support::two_clients_race(&a, &b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_on_another_instance_wakes_waiters() {
    let (a, b) = (cluster_store().await, cluster_store().await);
    support::other_instance_wakes_waiter(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_pieces_are_shared_and_wake_readers_on_another_instance() {
    let (a, b) = (cluster_store().await, cluster_store().await);
    support::other_instance_reads_and_wakes_on_pieces(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_completions_someone_waits_for_are_announced() {
    let (a, b) = (cluster_store().await, cluster_store().await);
    // PUBLISH on a cluster reaches every node: listen on any.
    support::announcements_only_when_waited(&a, &b, &support::cluster_urls()[0]).await;
}

/// Records hash by their digest alone (the `{…}` tag), so they land on every
/// primary; each record's scripts run on the node that owns its slot.
#[tokio::test]
async fn records_spread_over_all_primaries() {
    let store = cluster_store().await;
    let urls = support::cluster_urls();
    let mut admin = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ranges: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut admin)
        .await
        .unwrap();
    let redis::Value::Array(ranges) = ranges else {
        panic!("CLUSTER SLOTS: {ranges:?}")
    };
    let ranges: Vec<(i64, i64)> = ranges
        .into_iter()
        .map(|range| match range {
            redis::Value::Array(items) => match (&items[0], &items[1]) {
                (redis::Value::Int(a), redis::Value::Int(b)) => (*a, *b),
                other => panic!("slot range {other:?}"),
            },
            other => panic!("slot range {other:?}"),
        })
        .collect();
    assert_eq!(ranges.len(), 3, "a three-primary cluster");

    let mut owners = HashSet::new();
    for _ in 0..30 {
        let request = fresh_request();
        assert!(matches!(
            store.try_claim(&request).await.unwrap(),
            Claim::Acquired(_)
        ));
        let key = store.record_key(request.identity.digest());
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut admin)
            .await
            .unwrap();
        let tag_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(request.identity.digest().to_hex())
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(slot, tag_slot, "the slot comes from the digest alone");
        owners.insert(
            ranges
                .iter()
                .position(|(lo, hi)| (*lo..=*hi).contains(&slot))
                .unwrap(),
        );
        assert!(
            store
                .get(request.identity.digest())
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(owners.len(), 3, "30 records all landed on {owners:?}");
}
