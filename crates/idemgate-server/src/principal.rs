//! Whom a key belongs to, as the binary's parts agree on it: the orders service's
//! bearer rule, and the principal an operator names for `idemgate keys` from what
//! they have at hand — made by the layer's own extractors, never a second copy.

use axum::http::{HeaderName, HeaderValue, Request, header};
use idemgate::{DefaultPrincipal, Principal, PrincipalError, PrincipalExtractor};
use idemgate_proxy::HeaderPrincipal;
use sha2::{Digest, Sha256};

/// The principal of a bearer token: `bearer:` and the token's SHA-256 in hex, so
/// the token itself is never stored (and `idemgate keys --bearer` finds its keys).
pub fn bearer_principal(token: &str) -> Principal {
    Principal::new(format!(
        "bearer:{}",
        hex::encode(Sha256::digest(token.as_bytes()))
    ))
}

/// What an operator knows about whom a key belongs to.
#[derive(Debug, Clone)]
pub enum PrincipalSpec {
    /// The principal string itself, as the layer stored it.
    Raw(String),
    /// The `Authorization` value of the client's request, for a proxy whose
    /// `--principal authorization` scopes keys by its HMAC under `secret`.
    Authorization {
        /// The whole header value (`Bearer abc…`).
        value: String,
        /// The proxy's principal secret.
        secret: Vec<u8>,
    },
    /// The bearer token of a request to `idemgate serve`'s orders API.
    Bearer(String),
    /// A header a proxy with `--principal header:NAME` trusts, and its value.
    Header(HeaderName, String),
}

/// Why [`principal_of`] could not make a principal.
#[derive(Debug, thiserror::Error)]
pub enum PrincipalSpecError {
    /// The value cannot be an HTTP header value.
    #[error("not a valid header value")]
    HeaderValue,
    /// The layer's extractor found no principal in it.
    #[error("{0}")]
    Extractor(#[from] PrincipalError),
}

/// The principal the layer makes from `spec`: by the layer's own extractors
/// (`DefaultPrincipal`, `HeaderPrincipal`) over a request carrying the header, or
/// the orders service's bearer rule, never a second copy of either.
pub fn principal_of(spec: &PrincipalSpec) -> Result<Principal, PrincipalSpecError> {
    let request_with = |name: HeaderName, value: &str| {
        let value = HeaderValue::from_str(value).map_err(|_| PrincipalSpecError::HeaderValue)?;
        let mut request = Request::new(());
        request.headers_mut().insert(name, value);
        Ok::<_, PrincipalSpecError>(request.into_parts().0)
    };
    match spec {
        PrincipalSpec::Raw(principal) => Ok(Principal::new(principal.clone())),
        PrincipalSpec::Authorization { value, secret } => {
            let parts = request_with(header::AUTHORIZATION, value)?;
            Ok(DefaultPrincipal::with_authorization_secret(secret).extract(&parts)?)
        }
        PrincipalSpec::Bearer(token) => Ok(bearer_principal(token)),
        PrincipalSpec::Header(name, value) => {
            let parts = request_with(name.clone(), value)?;
            Ok(HeaderPrincipal::new(name.clone()).extract(&parts)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_come_from_the_layers_extractors() {
        let secret = b"s3cret".to_vec();
        let derived = principal_of(&PrincipalSpec::Authorization {
            value: "Bearer abc".into(),
            secret: secret.clone(),
        })
        .unwrap();
        let parts = Request::builder()
            .header(header::AUTHORIZATION, "Bearer abc")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let layer = DefaultPrincipal::with_authorization_secret(&secret)
            .extract(&parts)
            .unwrap();
        assert_eq!(derived, layer);
        assert!(!derived.as_str().contains("abc"));
        assert_eq!(
            principal_of(&PrincipalSpec::Header(
                HeaderName::from_static("x-user"),
                "alice".into()
            ))
            .unwrap(),
            Principal::new("header:x-user:alice")
        );
        assert!(
            principal_of(&PrincipalSpec::Authorization {
                value: String::new(),
                secret,
            })
            .is_err()
        );
    }
}
