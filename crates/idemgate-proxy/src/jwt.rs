//! Who a request is from, by its bearer JWT (`--principal jwt`): the token is
//! verified here, so keys are scoped by a claim nobody can forge.

use std::collections::HashMap;
use std::fmt;

use http::header::AUTHORIZATION;
use http::request::Parts;
use idemgate::{Principal, PrincipalError, PrincipalExtractor};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// How far `exp` and `nbf` may be off, for clocks that disagree a little.
const LEEWAY_SECONDS: u64 = 30;

/// The principal named by one claim (default `sub`) of a verified bearer JWT.
///
/// A token is accepted only if its signature verifies with a configured key —
/// an HS256 secret, or the RS256/ES256 public keys of a JWKS document — its
/// `exp` has not passed and its `nbf` has (30 s of leeway either way), and its
/// `iss` and `aud` are the configured ones, when configured. Anything else is a
/// 401 before any claim: nothing is forwarded.
///
/// ```
/// let principal = idemgate_proxy::JwtPrincipal::hs256(b"a shared secret", "sub")
///     .with_issuer("https://auth.example");
/// let layer = idemgate::IdempotencyLayer::new(idemgate::MemoryStore::new()).with_principal(principal);
/// ```
#[derive(Clone)]
pub struct JwtPrincipal {
    keys: Keys,
    claim: String,
    issuer: Option<String>,
    audience: Option<String>,
}

#[derive(Clone)]
enum Keys {
    /// One HS256 secret.
    Secret(DecodingKey),
    /// Public keys by `kid`, and the ones without a `kid`.
    Jwks {
        by_id: HashMap<String, (Algorithm, DecodingKey)>,
        unnamed: Vec<(Algorithm, DecodingKey)>,
    },
}

impl fmt::Debug for JwtPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = match &self.keys {
            Keys::Secret(_) => "HS256 secret".to_owned(),
            Keys::Jwks { by_id, unnamed } => format!("{} JWKS keys", by_id.len() + unnamed.len()),
        };
        f.debug_struct("JwtPrincipal")
            .field("keys", &keys)
            .field("claim", &self.claim)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish()
    }
}

/// Why a JWKS document cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    /// Not a JWKS (`{"keys": [...]}`).
    #[error("not a JWKS document: {0}")]
    Malformed(#[source] serde_json::Error),
    /// A key of another kind than RSA (RS256) or P-256 (ES256).
    #[error("key {index}: only RSA (RS256) and P-256 (ES256) public keys are supported")]
    Unsupported {
        /// Its position in `keys`.
        index: usize,
    },
    /// The key's parameters do not make a key.
    #[error("key {index}: {source}")]
    Invalid {
        /// Its position in `keys`.
        index: usize,
        /// Why.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// No key at all: every token would be refused.
    #[error("the JWKS has no keys")]
    Empty,
}

impl JwtPrincipal {
    /// Verifies HS256 tokens with `secret`; the principal is the claim `claim`.
    pub fn hs256(secret: &[u8], claim: impl Into<String>) -> Self {
        Self::with_keys(Keys::Secret(DecodingKey::from_secret(secret)), claim)
    }

    /// Verifies RS256 and ES256 tokens with the public keys of the JWKS
    /// document `jwks` (a token's `kid` picks its key; a token without one is
    /// tried against the keys without one).
    pub fn jwks(jwks: &[u8], claim: impl Into<String>) -> Result<Self, JwksError> {
        let set: JwkSet = serde_json::from_slice(jwks).map_err(JwksError::Malformed)?;
        let mut by_id = HashMap::new();
        let mut unnamed = Vec::new();
        for (index, jwk) in set.keys.iter().enumerate() {
            let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
                (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
                (AlgorithmParameters::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
                    if ec.curve == EllipticCurve::P256 =>
                {
                    Algorithm::ES256
                }
                _ => return Err(JwksError::Unsupported { index }),
            };
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|source| JwksError::Invalid { index, source })?;
            match &jwk.common.key_id {
                Some(id) => {
                    by_id.insert(id.clone(), (algorithm, key));
                }
                None => unnamed.push((algorithm, key)),
            }
        }
        if by_id.is_empty() && unnamed.is_empty() {
            return Err(JwksError::Empty);
        }
        Ok(Self::with_keys(Keys::Jwks { by_id, unnamed }, claim))
    }

    fn with_keys(keys: Keys, claim: impl Into<String>) -> Self {
        Self {
            keys,
            claim: claim.into(),
            issuer: None,
            audience: None,
        }
    }

    /// Accept only tokens whose `iss` is `issuer`.
    ///
    /// ```
    /// let principal = idemgate_proxy::JwtPrincipal::hs256(b"s", "sub").with_issuer("https://auth.example");
    /// ```
    pub fn with_issuer(mut self, issuer: impl Into<String>) -> Self {
        self.issuer = Some(issuer.into());
        self
    }

    /// Accept only tokens whose `aud` is or contains `audience`.
    ///
    /// ```
    /// let principal = idemgate_proxy::JwtPrincipal::hs256(b"s", "sub").with_audience("orders-api");
    /// ```
    pub fn with_audience(mut self, audience: impl Into<String>) -> Self {
        self.audience = Some(audience.into());
        self
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        match &self.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                required.push("aud");
            }
            // Without a configured audience a token's `aud` is not checked.
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        validation
    }

    /// The key and algorithm for a token with header `header`.
    fn key_for(
        &self,
        header: &jsonwebtoken::Header,
    ) -> Result<Vec<(Algorithm, &DecodingKey)>, PrincipalError> {
        let refused = |why: &str| Err(PrincipalError::Refused(why.to_owned()));
        match &self.keys {
            Keys::Secret(key) if header.alg == Algorithm::HS256 => {
                Ok(vec![(Algorithm::HS256, key)])
            }
            Keys::Secret(_) => refused("the token is not signed with HS256"),
            Keys::Jwks { by_id, unnamed } => {
                let candidates: Vec<(Algorithm, &DecodingKey)> = match &header.kid {
                    Some(id) => by_id.get(id).map(|(a, k)| (*a, k)).into_iter().collect(),
                    None => unnamed.iter().map(|(a, k)| (*a, k)).collect(),
                };
                let candidates: Vec<_> = candidates
                    .into_iter()
                    .filter(|(algorithm, _)| *algorithm == header.alg)
                    .collect();
                if candidates.is_empty() {
                    return refused("no configured key verifies this token");
                }
                Ok(candidates)
            }
        }
    }
}

impl PrincipalExtractor for JwtPrincipal {
    fn extract(&self, parts: &Parts) -> Result<Principal, PrincipalError> {
        let mut lines = parts.headers.get_all(AUTHORIZATION).iter();
        let (first, second) = (lines.next(), lines.next());
        if second.is_some() {
            return Err(PrincipalError::Ambiguous(AUTHORIZATION));
        }
        let value = first.ok_or(PrincipalError::Missing)?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| PrincipalError::Refused("expected a bearer token".to_owned()))?;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| PrincipalError::Refused("not a JWT".to_owned()))?;
        let mut last_error = None;
        for (algorithm, key) in self.key_for(&header)? {
            match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                token,
                key,
                &self.validation(algorithm),
            ) {
                Ok(data) => {
                    return principal_of_claim(&self.claim, data.claims.get(&self.claim));
                }
                Err(error) => last_error = Some(error),
            }
        }
        let why = match last_error.as_ref().map(jsonwebtoken::errors::Error::kind) {
            Some(jsonwebtoken::errors::ErrorKind::ExpiredSignature) => "the token has expired",
            Some(jsonwebtoken::errors::ErrorKind::ImmatureSignature) => {
                "the token is not valid yet (nbf)"
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidIssuer) => {
                "the token's issuer is not accepted"
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidAudience) => {
                "the token's audience is not accepted"
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidSignature) => {
                "the token's signature does not verify"
            }
            _ => "the token is invalid",
        };
        Err(PrincipalError::Refused(why.to_owned()))
    }
}

/// The principal a claim's value names, exactly: a string as it is
/// (`jwt:<claim>:<value>`), an integer under a prefix of its own
/// (`jwt-number:<claim>:<digits>`), so the string `"42"` and the number `42` are
/// two principals. A fraction or an exponent is refused: serde_json reads it as
/// an `f64`, which rounds (`1e400`, `0.1000000000000000055`), so two different
/// claims could become one principal.
fn principal_of_claim(
    claim: &str,
    value: Option<&serde_json::Value>,
) -> Result<Principal, PrincipalError> {
    match value {
        Some(serde_json::Value::String(s)) if !s.is_empty() => {
            Ok(Principal::new(format!("jwt:{claim}:{s}")))
        }
        Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => {
            Ok(Principal::new(format!("jwt-number:{claim}:{n}")))
        }
        Some(serde_json::Value::Number(_)) => Err(PrincipalError::Refused(format!(
            "the token's {claim:?} claim is a number that is not an integer; it cannot name a principal exactly"
        ))),
        _ => Err(PrincipalError::Refused(format!(
            "the token has no {claim:?} claim to scope keys by"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header, encode, get_current_timestamp};
    use serde_json::json;

    use super::*;

    fn parts(token: &str) -> Parts {
        http::Request::builder()
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn token(secret: &[u8], claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    #[test]
    fn hs256_tokens_name_their_claim_and_bad_ones_are_refused() {
        let now = get_current_timestamp();
        let principal = JwtPrincipal::hs256(b"secret", "sub")
            .with_issuer("https://auth.example")
            .with_audience("orders");
        let good = json!({"sub": "alice", "exp": now + 600, "iss": "https://auth.example", "aud": "orders"});
        assert_eq!(
            principal
                .extract(&parts(&token(b"secret", good.clone())))
                .unwrap(),
            Principal::new("jwt:sub:alice")
        );
        let refused = |claims: serde_json::Value, secret: &[u8]| match principal
            .extract(&parts(&token(secret, claims)))
        {
            Err(PrincipalError::Refused(why)) => why,
            other => panic!("{other:?}"),
        };
        let with = |key: &str, value: serde_json::Value| {
            let mut claims = good.clone();
            claims[key] = value;
            claims
        };
        assert!(refused(good.clone(), b"forged").contains("signature"));
        assert!(refused(with("exp", json!(now - 3600)), b"secret").contains("expired"));
        assert!(refused(with("nbf", json!(now + 3600)), b"secret").contains("not valid yet"));
        assert!(refused(with("iss", json!("https://evil.example")), b"secret").contains("issuer"));
        assert!(refused(with("aud", json!("billing")), b"secret").contains("audience"));
        assert!(refused(with("sub", json!(null)), b"secret").contains("\"sub\""));
        let no_exp = json!({"sub": "alice", "iss": "https://auth.example", "aud": "orders"});
        assert!(matches!(
            principal.extract(&parts(&token(b"secret", no_exp))),
            Err(PrincipalError::Refused(_))
        ));
        assert!(matches!(
            principal.extract(&parts("not.a.jwt")),
            Err(PrincipalError::Refused(_))
        ));
        let none = http::Request::builder().body(()).unwrap().into_parts().0;
        assert_eq!(principal.extract(&none), Err(PrincipalError::Missing));
    }

    #[test]
    fn claims_name_principals_exactly() {
        let now = get_current_timestamp();
        let principal = JwtPrincipal::hs256(b"secret", "sub");
        let of = |sub: serde_json::Value| {
            principal.extract(&parts(&token(
                b"secret",
                json!({"sub": sub, "exp": now + 600}),
            )))
        };
        let string = of(json!("42")).unwrap();
        let number = of(json!(42)).unwrap();
        assert_eq!(string, Principal::new("jwt:sub:42"));
        assert_ne!(
            string, number,
            "the string \"42\" and the number 42 are two principals"
        );
        assert_eq!(of(json!(42)).unwrap(), number);
        assert_ne!(of(json!(-42)).unwrap(), number);
        for inexact in [json!(1.5), json!(1e300)] {
            assert!(matches!(of(inexact), Err(PrincipalError::Refused(_))));
        }
        assert!(matches!(of(json!("")), Err(PrincipalError::Refused(_))));
        assert!(matches!(of(json!(["a"])), Err(PrincipalError::Refused(_))));
    }

    #[test]
    fn a_jwks_of_unsupported_keys_is_refused() {
        assert!(matches!(
            JwtPrincipal::jwks(b"{}", "sub"),
            Err(JwksError::Malformed(_))
        ));
        assert!(matches!(
            JwtPrincipal::jwks(br#"{"keys":[]}"#, "sub"),
            Err(JwksError::Empty)
        ));
        let octet = br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#;
        assert!(matches!(
            JwtPrincipal::jwks(octet, "sub"),
            Err(JwksError::Unsupported { index: 0 })
        ));
    }
}
