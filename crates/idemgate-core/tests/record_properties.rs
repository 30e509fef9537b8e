//! Property tests of the record and its binary codec: every state round-trips
//! through the parts stores persist, every response through its encoding, and no
//! byte string makes a decoder panic.

use bytes::Bytes;
use idemgate_core::record::{RecordState, StoredResponse};
use idemgate_testkit::strategies::{record_state, stored_response};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn responses_round_trip_byte_for_byte(response in stored_response()) {
        let encoded = response.encode();
        prop_assert_eq!(&StoredResponse::decode(encoded.clone()).unwrap(), &response);
        // Decoding is stable: the decoded response encodes to the same bytes.
        prop_assert_eq!(StoredResponse::decode(encoded.clone()).unwrap().encode(), encoded);
        prop_assert_eq!(
            StoredResponse::decode_fields(&response.encode_fields()).unwrap(),
            (response.headers.clone(), response.trailers.clone())
        );
    }

    #[test]
    fn every_state_round_trips_through_the_parts_stores_keep(state in record_state()) {
        let rebuilt = RecordState::from_parts(
            state.status(),
            state.locked_until(),
            state.response().cloned(),
        );
        prop_assert_eq!(rebuilt, Ok(state.clone()));
        prop_assert_eq!(state.status().is_final(), state.response().is_some());
        prop_assert_eq!(state.status().as_str().parse(), Ok(state.status()));
    }

    #[test]
    fn parts_that_do_not_make_a_state_are_refused(state in record_state(), other in stored_response()) {
        // A final status without its response, or a response on a status that is
        // not final, is a decode error, never a record.
        let response = match state.response() {
            Some(_) => None,
            None => Some(other),
        };
        prop_assert!(RecordState::from_parts(state.status(), state.locked_until(), response).is_err());
    }

    #[test]
    fn any_bytes_decode_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = StoredResponse::decode(Bytes::from(bytes.clone()));
        let _ = StoredResponse::decode_fields(&bytes);
    }

    #[test]
    fn truncated_encodings_are_errors(response in stored_response(), cut in any::<prop::sample::Index>()) {
        let encoded = response.encode();
        let len = cut.index(encoded.len());
        if let Ok(decoded) = StoredResponse::decode(encoded.slice(..len)) {
            // Only a cut inside a retained body can still decode, as a shorter body.
            prop_assert_eq!(decoded.status, response.status);
            prop_assert_eq!(decoded.headers, response.headers);
        }
    }
}
