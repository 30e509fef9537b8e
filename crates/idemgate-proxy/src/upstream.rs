//! Where requests go: `--upstream http://host:port[/base]`, and how a request's
//! URI is rewritten onto it.

use std::str::FromStr;

use http::Uri;
use http::uri::{Authority, PathAndQuery, Scheme};

/// The upstream origin and an optional base path every request path is put under.
///
/// ```
/// let upstream: idemgate_proxy::Upstream = "http://127.0.0.1:3000/api".parse().unwrap();
/// let target = upstream.path_and_query(&"/orders?page=2".parse().unwrap());
/// assert_eq!(target, "/api/orders?page=2");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    authority: Authority,
    /// Empty, or starting with `/` and without a trailing `/`.
    base: String,
}

/// Why an upstream URL was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// Not a URI at all.
    #[error("not a URL: {0}")]
    Malformed(#[source] http::uri::InvalidUri),
    /// Only plain HTTP is spoken to the upstream (TLS is for later).
    #[error("the scheme must be http:// (got {0:?})")]
    Scheme(String),
    /// `http://` without a host.
    #[error("no host:port")]
    NoAuthority,
    /// A query or credentials cannot be merged with every request's own.
    #[error("the upstream URL may not carry a query or user info")]
    Unsupported,
}

impl FromStr for Upstream {
    type Err = UpstreamError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let uri: Uri = text.parse().map_err(UpstreamError::Malformed)?;
        match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => {}
            other => {
                return Err(UpstreamError::Scheme(
                    other.map(ToString::to_string).unwrap_or_default(),
                ));
            }
        }
        let authority = uri.authority().cloned().ok_or(UpstreamError::NoAuthority)?;
        if uri.query().is_some() || authority.as_str().contains('@') {
            return Err(UpstreamError::Unsupported);
        }
        let base = uri.path().trim_end_matches('/').to_owned();
        Ok(Self { authority, base })
    }
}

impl Upstream {
    /// The request target (origin-form) a request for `original` is sent
    /// with: the base path, then the request's own path and query, unchanged.
    pub fn path_and_query(&self, original: &Uri) -> PathAndQuery {
        match original.path_and_query() {
            // No base: the request's own, shared rather than copied.
            Some(own) if self.base.is_empty() && own.as_str().starts_with('/') => own.clone(),
            own => {
                let own = own.map_or("/", PathAndQuery::as_str);
                let joined = format!("{}{own}", self.base);
                // The parts were each valid; a request path that is not ("*"
                // in an OPTIONS request) falls back to the base itself.
                PathAndQuery::try_from(joined).unwrap_or_else(|_| {
                    PathAndQuery::try_from(format!("{}/", self.base))
                        .unwrap_or(PathAndQuery::from_static("/"))
                })
            }
        }
    }

    /// The upstream's `host:port`, for logs.
    pub fn authority(&self) -> &str {
        self.authority.as_str()
    }

    /// The upstream's host and port, to connect to.
    pub(crate) fn authority_parts(&self) -> &Authority {
        &self.authority
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(upstream: &str, path: &str) -> String {
        let upstream: Upstream = upstream.parse().unwrap();
        upstream.path_and_query(&path.parse().unwrap()).to_string()
    }

    #[test]
    fn paths_go_under_the_base() {
        assert_eq!(target("http://h:1", "/a?b=c"), "/a?b=c");
        assert_eq!(target("http://h:1/", "/a"), "/a");
        assert_eq!(target("http://h:1/v1/", "/a/b"), "/v1/a/b");
        assert_eq!(target("http://h:1/v1", "/"), "/v1/");
        // An absolute-form request target keeps only its path and query.
        assert_eq!(
            target("http://h:1/v1", "http://client.example/x?y"),
            "/v1/x?y"
        );
    }

    #[test]
    fn only_plain_http_origins() {
        assert!(matches!(
            "https://h:1".parse::<Upstream>(),
            Err(UpstreamError::Scheme(_))
        ));
        assert!(matches!(
            "h:1".parse::<Upstream>(),
            Err(UpstreamError::Scheme(_))
        ));
        assert!(matches!(
            "http://h:1/?x=1".parse::<Upstream>(),
            Err(UpstreamError::Unsupported)
        ));
        assert!(matches!(
            "not a url".parse::<Upstream>(),
            Err(UpstreamError::Malformed(_))
        ));
    }
}
