//! Who a request is from, when an authenticating proxy in front says so.

use http::HeaderName;
use http::request::Parts;
use idemgate::{Principal, PrincipalError, PrincipalExtractor};

/// The principal named by a header that an authenticating proxy in front sets
/// (`--principal header:X-User-Id`), trusted as is: only deploy it where clients
/// cannot reach the proxy without passing that authentication.
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
        match first.map(|value| String::from_utf8_lossy(value.as_bytes()).trim().to_owned()) {
            Some(value) if !value.is_empty() => {
                Ok(Principal::new(format!("header:{}:{value}", self.name)))
            }
            _ => Err(PrincipalError::Missing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            extractor.extract(&parts(&[" "])),
            Err(PrincipalError::Missing)
        );
        assert!(matches!(
            extractor.extract(&parts(&["a", "b"])),
            Err(PrincipalError::Ambiguous(_))
        ));
    }
}
