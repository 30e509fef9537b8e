//! What the suites are made of, and what a store's own tests borrow: fresh claim
//! requests, a response that is hard to store exactly, completions, and claims that
//! must be acquired.
//!
//! Every request is for a fresh random principal unless built with
//! [`request_for`], so tests that use these share one database and run in parallel.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::IdempotencyKey;
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_core::scope::{Identity, Principal, Scope};
use idemgate_core::{Claim, ClaimRequest, Completion, FinalStatus, Lease, Store};

/// A lease or TTL no test outlives.
pub(crate) const LONG: Duration = Duration::from_secs(60);
/// A record's usual TTL in the suites: a day.
pub const DAY: Duration = Duration::from_secs(86_400);

/// A claim request for a fresh, random identity.
pub fn fresh_request() -> ClaimRequest {
    request_for(
        &uuid::Uuid::new_v4().to_string(),
        "POST",
        "/orders",
        "key-1",
        1,
    )
}

/// A claim request built from its parts; `body` picks the fingerprint.
pub fn request_for(principal: &str, method: &str, path: &str, key: &str, body: u8) -> ClaimRequest {
    let scope = Scope {
        principal: Principal::new(principal),
        method: method.into(),
        path: path.into(),
    };
    ClaimRequest {
        identity: Identity::new(
            scope,
            IdempotencyKey::parse(key.as_bytes(), 255).expect("valid key"),
        ),
        fingerprint: Fingerprint::from_bytes([body; 32]),
        field_digests: None,
        lease: LONG,
        ttl: DAY,
        route_template: None,
    }
}

/// A response with repeated headers, a non-UTF-8 header value, every byte value in
/// the body and trailers with a repeated name (a gRPC call's outcome): what a
/// store must give back exactly.
pub fn awkward_response() -> StoredResponse {
    StoredResponse {
        trailers: vec![
            (
                HeaderName::from_static("grpc-status"),
                HeaderValue::from_static("0"),
            ),
            (
                HeaderName::from_static("x-receipt-bin"),
                HeaderValue::from_static("AAEC"),
            ),
            (
                HeaderName::from_static("x-receipt-bin"),
                HeaderValue::from_static("AwQF"),
            ),
        ],
        status: StatusCode::CREATED,
        headers: vec![
            (
                HeaderName::from_static("location"),
                HeaderValue::from_static("/orders/7"),
            ),
            (
                HeaderName::from_static("x-tag"),
                HeaderValue::from_static("b"),
            ),
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                HeaderName::from_static("x-tag"),
                HeaderValue::from_static("a"),
            ),
            (
                HeaderName::from_static("x-latin1"),
                HeaderValue::from_bytes(b"caf\xe9").expect("obs-text"),
            ),
        ],
        body: StoredBody::Retained(Bytes::from(
            (0..=255u8).chain((0..=255u8).rev()).collect::<Vec<_>>(),
        )),
    }
}

/// A `Completed` completion of `response`, kept for a day.
pub fn completion(response: StoredResponse) -> Completion {
    Completion {
        status: FinalStatus::Completed,
        response,
        ttl: DAY,
    }
}

/// Claims `request`, which must be acquired (a fresh or claimable record).
pub async fn acquire(store: &dyn Store, request: &ClaimRequest) -> Lease {
    match store.try_claim(request).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(snapshot) => {
            panic!("expected to acquire, found {:?}", snapshot.record.status())
        }
    }
}

/// Claims a fresh identity whose record lives `ttl` (a record a purge test wants
/// to expire, or keep).
pub async fn claim_with_ttl(store: &dyn Store, ttl: Duration) -> Lease {
    let request = ClaimRequest {
        ttl,
        ..fresh_request()
    };
    acquire(store, &request).await
}
