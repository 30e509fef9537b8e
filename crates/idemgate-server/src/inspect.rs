//! Inspecting and evicting one key, for operators: what `idemgate keys show|evict`
//! and the admin API's `GET|DELETE /v1/keys` share.
//!
//! An operator names a record by the parts of its identity — principal, method,
//! path, key — and [`KeyQuery::identity`] turns them into the digest stores index
//! by, through the same `idemgate-core` code the layer runs on every request
//! (`IdempotencyKey::parse`, `normalize_path`, `Identity::new`), so the two cannot
//! disagree. Principals are opaque strings the layer built
//! (`crate::principal` makes them from what an operator has at hand).
//!
//! Evicting is dangerous: the next request with the key is a new operation, so an
//! operation that already ran (or, forced, still runs) can run a second time.

use std::time::{Duration, UNIX_EPOCH};

use axum::http::Method;
use base64::Engine as _;
use idemgate::compression::decompress;
use idemgate::key::{DEFAULT_MAX_KEY_LENGTH, IdempotencyKey, KeyError};
use idemgate::record::{Record, StoredBody};
use idemgate::scope::{Identity, Scope, normalize_path};
use idemgate::time::Timestamp;
use idemgate::{Eviction, Principal, Snapshot};
use serde::Serialize;

/// The parts of one record's identity, as an operator gives them.
#[derive(Debug, Clone)]
pub struct KeyQuery {
    /// Whose key: the principal string the layer stored (see [`crate::principal::principal_of`]).
    pub principal: Principal,
    /// The request method (`POST`); standard methods are accepted in any case.
    pub method: String,
    /// The request path as the client sent it (`/api/v1/orders`); it is normalized
    /// the way the layer normalizes it.
    pub path: String,
    /// The `Idempotency-Key` value, bare or as a quoted sf-string.
    pub key: String,
}

/// A [`KeyQuery`] that names no identity.
#[derive(Debug, thiserror::Error)]
pub enum KeyQueryError {
    /// The principal is empty.
    #[error("the principal is empty")]
    EmptyPrincipal,
    /// Not an HTTP method.
    #[error("not an HTTP method: {0:?}")]
    Method(String),
    /// The path does not start with `/`.
    #[error("the path must start with '/': {0:?}")]
    Path(String),
    /// Not a key the layer accepts.
    #[error("not a valid Idempotency-Key: {0}")]
    Key(#[from] KeyError),
}

impl KeyQuery {
    /// The identity the layer would store this key under.
    pub fn identity(&self) -> Result<Identity, KeyQueryError> {
        if self.principal.as_str().is_empty() {
            return Err(KeyQueryError::EmptyPrincipal);
        }
        let method = Method::from_bytes(self.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| KeyQueryError::Method(self.method.clone()))?;
        if !self.path.starts_with('/') {
            return Err(KeyQueryError::Path(self.path.clone()));
        }
        let key = IdempotencyKey::parse(self.key.as_bytes(), DEFAULT_MAX_KEY_LENGTH)?;
        let scope = Scope {
            principal: self.principal.clone(),
            method: method.as_str().to_owned(),
            path: normalize_path(&self.path),
        };
        Ok(Identity::new(scope, key))
    }
}

/// A record as an operator sees it: JSON for `keys show` and `GET /v1/keys`.
#[derive(Debug, Serialize)]
pub struct KeyView {
    /// The identity digest (hex), as logs and the Redis key name it.
    pub identity: String,
    /// `PROCESSING`, `COMPLETED`, `FAILED` or `RELEASED`.
    pub status: &'static str,
    /// The operation's id (business writes and downstream keys derive from it).
    pub operation_id: String,
    /// The current holder's fencing token.
    pub fencing_token: u64,
    /// The request fingerprint (hex): another one with this key is a 422.
    pub fingerprint: String,
    /// First claim (RFC 3339, store clock).
    pub created_at: String,
    /// When the record stops existing and the key is new again.
    pub expires_at: String,
    /// Milliseconds until `expires_at`.
    pub expires_in_ms: u64,
    /// The store's clock when it read the record.
    pub store_now: String,
    /// The holder's lease, while `PROCESSING`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// The stored response, once `COMPLETED` or `FAILED`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseView>,
}

/// A running record's lease.
#[derive(Debug, Serialize)]
pub struct LeaseView {
    /// End of the lease (RFC 3339, store clock).
    pub locked_until: String,
    /// Milliseconds the holder has left; 0 once lapsed (a retry takes it over).
    pub remaining_ms: u64,
    /// Whether the holder may still be running it.
    pub live: bool,
}

/// A stored response: its status and size, and its headers and body only when
/// asked (`--body`, `body=true`), since they may carry personal data.
#[derive(Debug, Serialize)]
pub struct ResponseView {
    /// The HTTP status replayed.
    pub status: u16,
    /// How many headers are replayed.
    pub header_count: usize,
    /// Whether the body was kept (`false`: it was over the stored-response limit,
    /// and replays carry `Idempotency-Response: not-retained`).
    pub body_retained: bool,
    /// The body's size in bytes, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_bytes: Option<usize>,
    /// The bytes the store keeps for the body, when kept: less than
    /// `body_bytes` when it is stored compressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_body_bytes: Option<usize>,
    /// A stream recorded in pieces (PROTOCOL §20): how many pieces follow its
    /// head in the store (`body_bytes` and `body` are not read from them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_pieces: Option<u32>,
    /// The headers in replay order, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<(String, String)>>,
    /// The body, when asked: UTF-8 text as is, anything else in base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<BodyView>,
}

/// A stored body in JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyView {
    /// A body that is valid UTF-8.
    Text(String),
    /// Any other body, in standard base64.
    Base64(String),
}

impl KeyView {
    /// The view of what `get` read under `identity`; the body only `with_body`.
    pub fn of(identity: &Identity, snapshot: &Snapshot, with_body: bool) -> Self {
        let Snapshot { record, now } = snapshot;
        let now = *now;
        Self {
            identity: identity.digest().to_hex(),
            status: record.status().as_str(),
            operation_id: record.operation_id.to_string(),
            fencing_token: record.token.0,
            fingerprint: hex::encode(record.fingerprint.as_bytes()),
            created_at: rfc3339(record.created_at),
            expires_at: rfc3339(record.expires_at),
            expires_in_ms: millis(record.expires_at.duration_since(now)),
            store_now: rfc3339(now),
            lease: record.locked_until().map(|until| LeaseView {
                locked_until: rfc3339(until),
                remaining_ms: millis(until.duration_since(now)),
                live: record.lease_is_live(now),
            }),
            response: response_view(record, with_body),
        }
    }
}

fn response_view(record: &Record, with_body: bool) -> Option<ResponseView> {
    let stored = record.response()?;
    let stored_body_bytes = match &stored.body {
        StoredBody::Retained(body) => Some(body.len()),
        StoredBody::NotRetained | StoredBody::InPieces(_) => None,
    };
    let stream_pieces = match stored.body {
        StoredBody::InPieces(pieces) => Some(pieces),
        _ => None,
    };
    // What replays send: the body as the handler answered it. A body that does
    // not decompress is shown as stored (a replay of it answers store-corrupt).
    let response = &decompress(stored).unwrap_or_else(|_| stored.clone());
    let body = match &response.body {
        StoredBody::Retained(body) => Some(body),
        StoredBody::NotRetained | StoredBody::InPieces(_) => None,
    };
    Some(ResponseView {
        status: response.status.as_u16(),
        header_count: response.headers.len(),
        body_retained: body.is_some() || stream_pieces.is_some(),
        stream_pieces,
        body_bytes: body.map(|body| body.len()),
        stored_body_bytes,
        headers: with_body.then(|| {
            response
                .headers
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.as_str().to_owned(), value)
                })
                .collect()
        }),
        body: body
            .filter(|_| with_body)
            .map(|body| match std::str::from_utf8(body) {
                Ok(text) => BodyView::Text(text.to_owned()),
                Err(_) => BodyView::Base64(base64::engine::general_purpose::STANDARD.encode(body)),
            }),
    })
}

/// What an eviction did: JSON for `keys evict` and `DELETE /v1/keys`.
#[derive(Debug, Serialize)]
pub struct EvictionView {
    /// The identity digest (hex).
    pub identity: String,
    /// `evicted`, `absent` or `refused`.
    pub outcome: &'static str,
    /// The state the record was removed in (`evicted` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_status: Option<&'static str>,
    /// Milliseconds left on the live lease that stopped it (`refused` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_remaining_ms: Option<u64>,
    /// What to do next, in words.
    pub detail: &'static str,
}

impl EvictionView {
    /// The view of `eviction` of `identity`.
    pub fn of(identity: &Identity, eviction: Eviction) -> Self {
        let mut view = Self {
            identity: identity.digest().to_hex(),
            outcome: "absent",
            previous_status: None,
            lease_remaining_ms: None,
            detail: "no live record under this key: nothing to evict",
        };
        match eviction {
            Eviction::Evicted { status } => {
                view.outcome = "evicted";
                view.previous_status = Some(status.as_str());
                view.detail = "removed: the next request with this key runs as a new operation";
            }
            Eviction::Absent => {}
            Eviction::RefusedLiveLease { locked_until, now } => {
                view.outcome = "refused";
                view.lease_remaining_ms = Some(millis(locked_until.duration_since(now)));
                view.detail = "a request holding this key may still be running: wait for the lease, or force (a retry may then run the operation beside it)";
            }
        }
        view
    }
}

/// Time left on the live lease of a refused eviction.
pub fn lease_left(eviction: Eviction) -> Option<Duration> {
    match eviction {
        Eviction::RefusedLiveLease { locked_until, now } => Some(locked_until.duration_since(now)),
        Eviction::Evicted { .. } | Eviction::Absent => None,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn rfc3339(at: Timestamp) -> String {
    let since_epoch = Duration::from_millis(u64::try_from(at.as_millis()).unwrap_or(0));
    humantime::format_rfc3339_millis(UNIX_EPOCH + since_epoch).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(method: &str, path: &str, key: &str) -> KeyQuery {
        KeyQuery {
            principal: Principal::new("user:1"),
            method: method.into(),
            path: path.into(),
            key: key.into(),
        }
    }

    #[test]
    fn the_identity_is_the_layers() {
        let layer = Identity::new(
            Scope {
                principal: Principal::new("user:1"),
                method: "POST".into(),
                path: "/api/~orders".into(),
            },
            IdempotencyKey::parse(b"k-1", 255).unwrap(),
        );
        for spelling in [
            query("POST", "/api/~orders", "k-1"),
            query("post", "/api/%7Eorders/", "\"k-1\""),
        ] {
            assert_eq!(spelling.identity().unwrap().digest(), layer.digest());
        }
        assert!(matches!(
            query("PO ST", "/x", "k").identity(),
            Err(KeyQueryError::Method(_))
        ));
        assert!(matches!(
            query("POST", "x", "k").identity(),
            Err(KeyQueryError::Path(_))
        ));
        assert!(matches!(
            query("POST", "/x", "a,b").identity(),
            Err(KeyQueryError::Key(_))
        ));
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(
            rfc3339(Timestamp::from_millis(1_764_590_400_123)),
            "2025-12-01T12:00:00.123Z"
        );
    }
}
