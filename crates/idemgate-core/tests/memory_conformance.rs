//! `MemoryStore` against the shared conformance suite, plus what only it promises.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::{Claim, MemoryStore, Store, StoreError};
use idemgate_testkit::fixtures::fresh_request;

async fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

idemgate_testkit::store_conformance!(store);

#[tokio::test]
async fn capacity_refuses_new_claims_and_never_evicts_a_live_record() {
    let store = MemoryStore::new().with_capacity(3);
    let requests: Vec<_> = (0..3).map(|_| fresh_request()).collect();
    for request in &requests {
        assert!(matches!(
            store.try_claim(request).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
    let err = store.try_claim(&fresh_request()).await.unwrap_err();
    assert!(matches!(err, StoreError::Full), "{err:?}");
    assert_eq!(store.len(), 3);
    for request in &requests {
        assert!(
            matches!(store.try_claim(request).await.unwrap(), Claim::Existing(_)),
            "a live record was evicted"
        );
    }
}

#[tokio::test]
async fn capacity_is_freed_by_expired_records() {
    let store = MemoryStore::new().with_capacity(2);
    for _ in 0..2 {
        let request = idemgate_core::ClaimRequest {
            ttl: Duration::from_millis(50),
            ..fresh_request()
        };
        assert!(matches!(
            store.try_claim(&request).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        store.try_claim(&fresh_request()).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert!(store.len() <= 2, "capacity exceeded: {}", store.len());
}

#[tokio::test]
async fn expiry_frees_memory() {
    let store = MemoryStore::new();
    for _ in 0..1_000 {
        let request = idemgate_core::ClaimRequest {
            ttl: Duration::from_millis(50),
            ..fresh_request()
        };
        let _ = store.try_claim(&request).await.unwrap();
    }
    assert_eq!(store.len(), 1_000);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.purge_expired(), 1_000);
    assert!(store.is_empty());
}

#[tokio::test]
async fn shards_sweep_themselves_while_in_use() {
    let store = MemoryStore::new();
    for _ in 0..500 {
        let request = idemgate_core::ClaimRequest {
            ttl: Duration::from_millis(50),
            ..fresh_request()
        };
        let _ = store.try_claim(&request).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Enough fresh claims to touch every shard once; each sweeps on the way.
    for _ in 0..2_000 {
        let _ = store.try_claim(&fresh_request()).await.unwrap();
    }
    assert_eq!(
        store.len(),
        2_000,
        "expired records should have been swept by normal traffic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_history_keeps_a_bounded_number_of_routes() {
    idemgate_testkit::conformance::route_history_keeps_a_bounded_number_of_routes(store().await)
        .await;
}

/// A stream piece past the next index is refused as corrupt and kept
/// nowhere: a recording that lost pieces must not count them as kept.
#[tokio::test]
async fn a_stream_piece_past_the_next_is_an_error() {
    let store = MemoryStore::new();
    let lease = idemgate_testkit::fixtures::acquire(&store, &fresh_request()).await;
    let piece = bytes::Bytes::from_static(b"piece");
    assert!(matches!(
        store.append_stream_piece(&lease, 1, &piece).await,
        Err(StoreError::Corrupt(_))
    ));
    assert!(
        store
            .read_stream_pieces(&lease.stream(), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A stream piece is kept as a copy of its own: a piece that is a view into a
/// larger buffer (a proxied upstream's frame is a slice of hyper's read
/// buffer) would otherwise pin the whole buffer as long as the record lives.
#[tokio::test]
async fn a_kept_stream_piece_pins_no_buffer_it_was_sliced_from() {
    let store = MemoryStore::new();
    let lease = idemgate_testkit::fixtures::acquire(&store, &fresh_request()).await;
    let buffer = bytes::Bytes::from(vec![b'p'; 8192]);
    let write = store
        .append_stream_piece(&lease, 0, &buffer.slice(0..5))
        .await
        .unwrap();
    assert_eq!(write, idemgate_core::FencedWrite::Applied);
    assert!(buffer.is_unique(), "the store holds a view of the buffer");
    let kept = store
        .read_stream_pieces(&lease.stream(), 0, 10)
        .await
        .unwrap();
    assert_eq!(kept, vec![bytes::Bytes::from_static(b"ppppp")]);
}
