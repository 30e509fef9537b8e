//! Property tests of the `Idempotency-Key` parser (PROTOCOL §2): it never panics,
//! sf-strings and bare keys round-trip, and whatever it accepts it accepts again
//! when re-encoded.

use http::{HeaderMap, HeaderValue};
use idemgate_core::key::{DEFAULT_MAX_KEY_LENGTH, IDEMPOTENCY_KEY, IdempotencyKey, KeyError};
use proptest::prelude::*;

/// RFC 8941 §4.2.5 serialization: `"`, the content with `"` and `\` escaped, `"`.
fn sf_string(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// What an sf-string may hold: printable ASCII and space.
fn sf_content() -> impl Strategy<Value = String> {
    r"[\x20-\x7e]{1,255}"
}

/// What a bare key may hold: visible ASCII except `"` and `,`.
fn bare_content() -> impl Strategy<Value = String> {
    r"[\x21\x23-\x2b\x2d-\x7e]{1,255}"
}

fn ows() -> impl Strategy<Value = String> {
    r"[ \t]{0,3}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn never_panics(value in prop::collection::vec(any::<u8>(), 0..300), max in 0usize..300) {
        if let Ok(key) = IdempotencyKey::parse(&value, max) {
            prop_assert!(!key.as_str().is_empty());
            prop_assert!(key.as_str().len() <= max);
        }
    }

    #[test]
    fn sf_strings_round_trip(key in sf_content(), before in ows(), after in ows()) {
        let header = format!("{before}{}{after}", sf_string(&key));
        let parsed = IdempotencyKey::parse(header.as_bytes(), DEFAULT_MAX_KEY_LENGTH);
        prop_assert_eq!(parsed.as_ref().map(IdempotencyKey::as_str), Ok(key.as_str()));
    }

    #[test]
    fn bare_keys_round_trip(key in bare_content(), before in ows(), after in ows()) {
        let header = format!("{before}{key}{after}");
        let parsed = IdempotencyKey::parse(header.as_bytes(), DEFAULT_MAX_KEY_LENGTH);
        prop_assert_eq!(parsed.as_ref().map(IdempotencyKey::as_str), Ok(key.as_str()));
        // The bare form and the sf-string of the same content name the same key.
        let quoted = IdempotencyKey::parse(sf_string(&key).as_bytes(), DEFAULT_MAX_KEY_LENGTH);
        prop_assert_eq!(quoted, parsed);
    }

    #[test]
    fn an_accepted_key_is_accepted_again_as_an_sf_string(
        value in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        if let Ok(key) = IdempotencyKey::parse(&value, DEFAULT_MAX_KEY_LENGTH) {
            let again = IdempotencyKey::parse(sf_string(key.as_str()).as_bytes(), DEFAULT_MAX_KEY_LENGTH);
            prop_assert_eq!(again, Ok(key));
        }
    }

    #[test]
    fn lists_of_sf_strings_are_refused(first in sf_content(), second in sf_content()) {
        let header = format!("{}, {}", sf_string(&first), sf_string(&second));
        prop_assert_eq!(
            IdempotencyKey::parse(header.as_bytes(), DEFAULT_MAX_KEY_LENGTH),
            Err(KeyError::List)
        );
    }

    #[test]
    fn two_header_lines_are_refused_whatever_they_hold(first in bare_content(), second in bare_content()) {
        let mut headers = HeaderMap::new();
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_str(&first).unwrap());
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_str(&second).unwrap());
        prop_assert_eq!(
            IdempotencyKey::from_headers(&headers, DEFAULT_MAX_KEY_LENGTH),
            Err(KeyError::Repeated)
        );
    }
}
