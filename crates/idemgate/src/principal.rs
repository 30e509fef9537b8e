//! Who a request is from (PROTOCOL §3): the first part of every key's scope.

use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use http::header::AUTHORIZATION;
use http::request::Parts;
use sha2::Sha256;

pub use idemgate_core::scope::Principal;

/// Why no principal could be found: the request is answered 401 before any claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrincipalError {
    /// No authentication reached the layer.
    #[error(
        "no authenticated principal: the request carries no credentials the idempotency layer can scope its key by"
    )]
    Missing,
    /// Credentials were present but refused.
    #[error("credentials refused: {0}")]
    Refused(String),
    /// A header that names the principal came more than once: which line is meant
    /// is ambiguous (a proxy in front may have checked one, the layer would scope
    /// by another), so the request is refused with 400 before any claim.
    #[error("the {0} header appears more than once; send it once")]
    Ambiguous(http::HeaderName),
}

/// Finds the principal of a request from its parts.
///
/// Implemented for closures, so an application plugs in its own rule:
///
/// ```
/// use idemgate::principal::{Principal, PrincipalError};
///
/// let by_tenant_header = |parts: &http::request::Parts| {
///     parts.headers.get("x-tenant-id")
///         .and_then(|v| v.to_str().ok())
///         .map(|tenant| Principal::new(format!("tenant:{tenant}")))
///         .ok_or(PrincipalError::Missing)
/// };
/// let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new())
///     .with_principal(by_tenant_header);
/// ```
pub trait PrincipalExtractor: Send + Sync + 'static {
    /// The principal, or why there is none.
    fn extract(&self, parts: &Parts) -> Result<Principal, PrincipalError>;
}

impl<F> PrincipalExtractor for F
where
    F: Fn(&Parts) -> Result<Principal, PrincipalError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<Principal, PrincipalError> {
        self(parts)
    }
}

/// The default rule: the [`Principal`] an authentication layer put in the request
/// extensions; failing that, when a secret is configured, an HMAC-SHA256 of the
/// `Authorization` header under that secret.
///
/// The HMAC keeps credentials out of the store, but it scopes by the credential,
/// not by the user: a refreshed token starts a new scope, so a retry sent with a new
/// token is a new operation. Prefer an authentication layer that inserts a stable
/// [`Principal`] (a user or tenant id).
#[derive(Clone, Default)]
pub struct DefaultPrincipal {
    secret: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for DefaultPrincipal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DefaultPrincipal")
            .field("authorization_fallback", &self.secret.is_some())
            .finish()
    }
}

impl DefaultPrincipal {
    /// Extension only: requests without a [`Principal`] extension get 401.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Also accepts an `Authorization` header, scoped by its HMAC under `secret`.
    /// Keep the secret stable across restarts and instances, or replays stop
    /// matching.
    ///
    /// ```
    /// let principal = idemgate::DefaultPrincipal::with_authorization_secret(b"a stable secret");
    /// ```
    #[must_use]
    pub fn with_authorization_secret(secret: impl AsRef<[u8]>) -> Self {
        Self {
            secret: Some(Arc::from(secret.as_ref())),
        }
    }
}

impl PrincipalExtractor for DefaultPrincipal {
    fn extract(&self, parts: &Parts) -> Result<Principal, PrincipalError> {
        if let Some(principal) = parts.extensions.get::<Principal>() {
            return Ok(principal.clone());
        }
        let mut lines = parts.headers.get_all(AUTHORIZATION).iter();
        let (Some(secret), Some(credentials)) = (&self.secret, lines.next()) else {
            return Err(PrincipalError::Missing);
        };
        if lines.next().is_some() {
            return Err(PrincipalError::Ambiguous(AUTHORIZATION));
        }
        if credentials.is_empty() {
            return Err(PrincipalError::Missing);
        }
        Ok(Principal::new(format!(
            "authz:{}",
            hmac_hex(secret, credentials.as_bytes())
        )))
    }
}

/// HMAC-SHA256 of `message` under `secret`, as lower-case hex.
fn hmac_hex(secret: &[u8], message: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(message);
    idemgate_core::hex_text::encode(&mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(authorization: Option<&str>) -> Parts {
        let mut builder = Request::builder();
        if let Some(value) = authorization {
            builder = builder.header(AUTHORIZATION, value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn extension_wins() {
        let mut parts = parts(Some("Bearer t"));
        parts.extensions.insert(Principal::new("user:1"));
        let extractor = DefaultPrincipal::with_authorization_secret("s");
        assert_eq!(extractor.extract(&parts).unwrap(), Principal::new("user:1"));
    }

    #[test]
    fn authorization_is_hmaced_never_stored_raw() {
        let extractor = DefaultPrincipal::with_authorization_secret("server-secret");
        let a = extractor.extract(&parts(Some("Bearer token-a"))).unwrap();
        let b = extractor.extract(&parts(Some("Bearer token-b"))).unwrap();
        assert_ne!(a, b);
        assert!(!a.as_str().contains("token-a"));
        assert_eq!(
            a,
            extractor.extract(&parts(Some("Bearer token-a"))).unwrap()
        );
        let other_secret = DefaultPrincipal::with_authorization_secret("other");
        assert_ne!(
            a,
            other_secret
                .extract(&parts(Some("Bearer token-a")))
                .unwrap()
        );
    }

    #[test]
    fn two_authorization_lines_are_ambiguous() {
        let mut parts = parts(Some("Bearer a"));
        parts
            .headers
            .append(AUTHORIZATION, http::HeaderValue::from_static("Bearer b"));
        let extractor = DefaultPrincipal::with_authorization_secret("s");
        assert_eq!(
            extractor.extract(&parts),
            Err(PrincipalError::Ambiguous(AUTHORIZATION))
        );
    }

    #[test]
    fn nothing_to_go_on_is_an_error() {
        assert_eq!(
            DefaultPrincipal::new().extract(&parts(Some("Bearer t"))),
            Err(PrincipalError::Missing)
        );
        let with_secret = DefaultPrincipal::with_authorization_secret("s");
        assert_eq!(
            with_secret.extract(&parts(None)),
            Err(PrincipalError::Missing)
        );
        assert_eq!(
            with_secret.extract(&parts(Some(""))),
            Err(PrincipalError::Missing)
        );
    }
}
