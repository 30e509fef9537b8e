//! Proptest strategies for what stores keep: stored responses and record states,
//! over the whole range each codec must carry (any status, repeated and non-UTF-8
//! header values, empty and binary bodies, bodies not retained).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use idemgate_core::record::{RecordState, StoredBody, StoredResponse};
use idemgate_core::time::Timestamp;
use proptest::prelude::*;

/// A header name: lower-case token characters, as `http` normalizes them.
fn header_name() -> impl Strategy<Value = HeaderName> {
    "[a-z0-9!#$%&'*+.^_`|~-]{1,40}".prop_map(|name| {
        HeaderName::from_bytes(name.as_bytes()).expect("token characters make a header name")
    })
}

/// A header value: visible ASCII, spaces and tabs inside, and obs-text bytes.
fn header_value() -> impl Strategy<Value = HeaderValue> {
    prop::collection::vec(
        prop_oneof![0x21u8..=0x7e, Just(b' '), Just(b'\t'), 0x80u8..=0xff],
        0..64,
    )
    .prop_map(|mut bytes| {
        // Leading and trailing whitespace is not a field value's.
        while bytes.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
            bytes.remove(0);
        }
        while bytes.last().is_some_and(|b| *b == b' ' || *b == b'\t') {
            bytes.pop();
        }
        HeaderValue::from_bytes(&bytes).expect("no control bytes in a header value")
    })
}

/// Any response a store may have to keep.
pub fn stored_response() -> impl Strategy<Value = StoredResponse> {
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..4096)
            .prop_map(|bytes| StoredBody::Retained(Bytes::from(bytes))),
        // Long, compressible bodies, for codecs that compress.
        (any::<u8>(), 0usize..20_000)
            .prop_map(|(byte, len)| StoredBody::Retained(Bytes::from(vec![byte; len]))),
        Just(StoredBody::NotRetained),
    ];
    (
        100u16..=999,
        prop::collection::vec((header_name(), header_value()), 0..12),
        body,
    )
        .prop_map(|(status, headers, body)| StoredResponse {
            status: StatusCode::from_u16(status).expect("100..=999 is a status"),
            headers,
            body,
        })
}

/// Any record state, with its lease end or its response.
pub fn record_state() -> impl Strategy<Value = RecordState> {
    prop_oneof![
        (0i64..=i64::MAX / 2).prop_map(|ms| RecordState::Processing {
            locked_until: Timestamp::from_millis(ms)
        }),
        Just(RecordState::Released),
        stored_response().prop_map(RecordState::Completed),
        stored_response().prop_map(RecordState::Failed),
    ]
}
