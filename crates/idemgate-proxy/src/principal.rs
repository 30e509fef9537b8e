//! Who a request is from, when an authenticating proxy in front says so.

use http::HeaderName;
use http::request::Parts;
use idemgate::{Principal, PrincipalError, PrincipalExtractor};

/// The principal named by a header that an authenticating proxy in front sets
/// (`--principal header:X-User-Id`), trusted as is: only deploy it where clients
/// cannot reach the proxy without passing that authentication.
///
/// The principal is the value's exact bytes (`header:<name>:<value>`), so two
/// values are one principal only when they are byte for byte the same. A value
/// that is not visible ASCII (spaces and tabs inside allowed, none around it) is
/// refused (`401`, nothing claimed) rather than decoded: a lossy decode would
/// fold `user\xff1` and `user\xfe1` into one principal (PITFALLS 26).
///
/// ```
/// let principal = idemgate_proxy::HeaderPrincipal::new(http::HeaderName::from_static("x-user-id"));
/// let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new()).with_principal(principal);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderPrincipal {
    name: HeaderName,
}

impl HeaderPrincipal {
    /// Reads the principal from the header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl PrincipalExtractor for HeaderPrincipal {
    fn extract(&self, parts: &Parts) -> Result<Principal, PrincipalError> {
        let mut lines = parts.headers.get_all(&self.name).iter();
        let (first, second) = (lines.next(), lines.next());
        if second.is_some() {
            return Err(PrincipalError::Ambiguous(self.name.clone()));
        }
        let Some(value) = first.map(http::HeaderValue::as_bytes) else {
            return Err(PrincipalError::Missing);
        };
        let value = match value {
            [] => return Err(PrincipalError::Missing),
            [first, .., last] | [first @ last]
                if !first.is_ascii_graphic() || !last.is_ascii_graphic() =>
            {
                return Err(PrincipalError::Refused(format!(
                    "the {} header must be visible ASCII without surrounding whitespace",
                    self.name
                )));
            }
            bytes => bytes,
        };
        // Visible ASCII and inner blanks only: the bytes are their own text.
        match std::str::from_utf8(value) {
            Ok(text)
                if value
                    .iter()
                    .all(|b| b.is_ascii_graphic() || *b == b' ' || *b == b'\t') =>
            {
                Ok(Principal::new(format!("header:{}:{text}", self.name)))
            }
            _ => Err(PrincipalError::Refused(format!(
                "the {} header must be visible ASCII; other bytes are not decoded",
                self.name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn from_bytes(value: &[u8]) -> Result<Principal, PrincipalError> {
        let mut parts = http::Request::new(()).into_parts().0;
        parts.headers.insert(
            "x-user",
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
        HeaderPrincipal::new(HeaderName::from_static("x-user")).extract(&parts)
    }

    #[test]
    fn bytes_that_are_not_visible_ascii_are_refused_not_decoded() {
        for value in [
            &b"user\xff1"[..],
            b"user\xfe1",
            "usér".as_bytes(),
            b"\tuser",
            b"user ",
        ] {
            assert!(
                matches!(from_bytes(value), Err(PrincipalError::Refused(_))),
                "{value:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn two_values_are_one_principal_only_when_their_bytes_are_equal(
            a in prop::collection::vec(prop_oneof![0x20u8..=0x7e, 0x80u8..=0xff, Just(b'\t')], 1..12),
            b in prop::collection::vec(prop_oneof![0x20u8..=0x7e, 0x80u8..=0xff, Just(b'\t')], 1..12),
        ) {
            if let (Ok(pa), Ok(pb)) = (from_bytes(&a), from_bytes(&b)) {
                prop_assert_eq!(pa == pb, a == b);
            }
        }
    }

    fn parts(values: &[&'static str]) -> Parts {
        let mut builder = http::Request::builder();
        for value in values {
            builder = builder.header("x-user", *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn one_non_empty_line_names_the_principal() {
        let extractor = HeaderPrincipal::new(HeaderName::from_static("x-user"));
        assert_eq!(
            extractor.extract(&parts(&["alice"])).unwrap(),
            Principal::new("header:x-user:alice")
        );
        assert_ne!(
            extractor.extract(&parts(&["alice"])).unwrap(),
            extractor.extract(&parts(&["bob"])).unwrap()
        );
        assert_eq!(extractor.extract(&parts(&[])), Err(PrincipalError::Missing));
        assert!(matches!(
            extractor.extract(&parts(&[" "])),
            Err(PrincipalError::Refused(_))
        ));
        assert_eq!(
            extractor.extract(&parts(&["Alice Smith"])).unwrap(),
            Principal::new("header:x-user:Alice Smith")
        );
        assert!(matches!(
            extractor.extract(&parts(&["a", "b"])),
            Err(PrincipalError::Ambiguous(_))
        ));
    }
}
