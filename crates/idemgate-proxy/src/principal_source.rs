//! Which extractor names a request's principal: the choice an operator makes with
//! `idemgate proxy --principal`, as a value the proxy's layer is configured with.

use std::sync::Arc;

use http::HeaderName;
use idemgate::{DefaultPrincipal, IdempotencyLayer};

use crate::{HeaderPrincipal, JwtPrincipal};

/// Where the proxy finds whom a key belongs to (PROTOCOL §13).
///
/// ```
/// let source = idemgate_proxy::PrincipalSource::Header(http::HeaderName::from_static("x-user-id"));
/// let layer = source.apply_to(idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new()));
/// ```
#[derive(Clone)]
pub enum PrincipalSource {
    /// An HMAC-SHA256 of the whole `Authorization` value under this secret, so
    /// the credential itself is never stored.
    Authorization(Arc<[u8]>),
    /// This header, set by an authenticating hop in front and trusted as is.
    Header(HeaderName),
    /// A claim of a verified bearer JWT.
    Jwt(JwtPrincipal),
}

impl PrincipalSource {
    /// The header the principal is read from, when it is one: the guard
    /// protects it like the proxy's own headers.
    pub fn header(&self) -> Option<&HeaderName> {
        match self {
            Self::Header(name) => Some(name),
            Self::Authorization(_) | Self::Jwt(_) => None,
        }
    }

    /// `layer`, naming principals this way.
    pub fn apply_to(&self, layer: IdempotencyLayer) -> IdempotencyLayer {
        match self {
            Self::Authorization(secret) => {
                layer.with_principal(DefaultPrincipal::with_authorization_secret(secret))
            }
            Self::Header(name) => layer.with_principal(HeaderPrincipal::new(name.clone())),
            Self::Jwt(jwt) => layer.with_principal(jwt.clone()),
        }
    }
}

impl std::fmt::Debug for PrincipalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Authorization(_) => f.write_str("Authorization(<secret>)"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Jwt(jwt) => f.debug_tuple("Jwt").field(jwt).finish(),
        }
    }
}
