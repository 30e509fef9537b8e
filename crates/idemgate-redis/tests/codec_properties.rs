//! Property tests of the Redis response codec: every response round-trips byte for
//! byte whether or not it was compressed, whatever threshold the reader has, and
//! no stored value makes the decoder panic.

use bytes::Bytes;
use idemgate_redis::ResponseCodec;
use idemgate_testkit::strategies::stored_response;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn responses_round_trip_compressed_or_not(
        response in stored_response(),
        threshold in prop_oneof![Just(0usize), Just(1024), Just(usize::MAX)],
        reader_threshold in prop_oneof![Just(0usize), Just(usize::MAX)],
    ) {
        let stored = ResponseCodec::new(threshold).encode(&response);
        let decoded = ResponseCodec::new(reader_threshold).decode(Bytes::from(stored)).unwrap();
        prop_assert_eq!(decoded, response);
    }

    #[test]
    fn any_stored_value_decodes_without_panicking(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        tag in prop_oneof![Just(None), Just(Some(0u8)), Just(Some(1u8)), Just(Some(2u8)), Just(Some(0xffu8))],
    ) {
        let mut value = tag.map(|t| vec![t]).unwrap_or_default();
        value.extend_from_slice(&bytes);
        let _ = ResponseCodec::new(1024).decode(Bytes::from(value));
    }
}
