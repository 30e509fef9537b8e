//! Property tests of the key sources (PROTOCOL §15): the `KEY_SOURCE` spelling
//! round-trips, a body-field key is the same whatever the JSON's spelling, and no
//! input makes a source panic.

use http::HeaderMap;
use idemgate_core::fingerprint::FingerprintInput;
use idemgate_core::key::{ContentDedup, IdempotencyKey, KeyInput, KeySource};
use proptest::prelude::*;

/// A key a JSON string, a path segment or a query value can carry unescaped.
fn plain_key() -> impl Strategy<Value = String> {
    r"[A-Za-z0-9_-]{1,64}"
}

fn input<'a>(
    headers: &'a HeaderMap,
    path: &'a str,
    query: &'a str,
    body: &'a [u8],
) -> KeyInput<'a> {
    KeyInput {
        headers,
        path,
        template: Some("/orders/{order_id}"),
        query,
        content_type: Some("application/json"),
        body,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn spellings_round_trip(name in r"[a-z_][a-z0-9_]{0,20}") {
        for text in [
            format!("header:x-{name}"),
            format!("path:{name}"),
            format!("json:/{name}/0"),
            format!("query:{name}"),
        ] {
            let source: KeySource = text.parse().unwrap();
            prop_assert_eq!(source.to_string(), text);
        }
    }

    #[test]
    fn a_body_field_key_ignores_member_order_and_whitespace(
        key in plain_key(),
        amount in 0u32..100_000,
        space in r"[ \t\n]{0,3}",
    ) {
        let source: KeySource = "json:/reference_id".parse().unwrap();
        let headers = HeaderMap::new();
        let compact = format!(r#"{{"reference_id":"{key}","amount":{amount}}}"#);
        let spaced = format!(
            "{{{space}\"amount\"{space}:{space}{amount}.0,{space}\"reference_id\":{space}\"{key}\"{space}}}"
        );
        let a = source.key(&input(&headers, "/", "", compact.as_bytes()), 255).unwrap();
        let b = source.key(&input(&headers, "/", "", spaced.as_bytes()), 255).unwrap();
        prop_assert_eq!(a.as_ref().map(IdempotencyKey::as_str), Some(key.as_str()));
        prop_assert_eq!(a, b);
        let dedup = ContentDedup::new(std::time::Duration::from_secs(60));
        let content = |body: &str| {
            dedup.key(&FingerprintInput {
                method: "POST",
                path: "/transfers",
                query: "",
                content_type: Some("application/json"),
                headers: &[],
                body: body.as_bytes(),
            })
        };
        prop_assert_eq!(content(&compact), content(&spaced));
    }

    #[test]
    fn path_and_query_keys_are_the_value_sent(key in plain_key()) {
        let headers = HeaderMap::new();
        let path = format!("/orders/{key}");
        let query = format!("a=1&request_id={key}");
        let by_path: KeySource = "path:order_id".parse().unwrap();
        let by_query: KeySource = "query:request_id".parse().unwrap();
        let from_path = by_path.key(&input(&headers, &path, "", b""), 255).unwrap().unwrap();
        let from_query = by_query.key(&input(&headers, "/", &query, b""), 255).unwrap().unwrap();
        prop_assert_eq!(from_path.as_str(), key.as_str());
        prop_assert_eq!(from_query.as_str(), key.as_str());
    }

    #[test]
    fn no_input_makes_a_source_panic(
        path in r"\PC{0,40}",
        query in r"\PC{0,40}",
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let headers = HeaderMap::new();
        for source in ["path:order_id", "query:request_id", "json:/reference_id", "header:x-key"] {
            let source: KeySource = source.parse().unwrap();
            let _ = source.key(&input(&headers, &path, &query, &body), 255);
        }
        let _ = IdempotencyKey::from_value(&path, 255);
    }
}
