//! What the proxy settles about a request before the layer sees it, so the layer
//! and the upstream read one request: its target in canonical form, its method,
//! the headers a CGI-style server would read as ours, a body on a safe method.
//!
//! Each choice here is a refusal (`400` problem+json, before any claim, nothing
//! forwarded) or a rewrite the upstream then receives; none is a reading that
//! only the proxy makes. See `docs/proxy.md`, "What the upstream parses".

use http::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use idemgate::ProblemDetails;
use idemgate::path::{CanonicalPath, PathPolicy, canonicalize};
use serde::Deserialize;

use crate::headers::{IDEMPOTENCY_KEY, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};
use crate::problem;

/// The headers by which clients ask frameworks to treat a request as another
/// method (Rails, Express's `method-override`, Symfony, ASP.NET, Spring's
/// `HiddenHttpMethodFilter` for its parameter).
pub const METHOD_OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// What to do with request headers whose names contain `_`. CGI, and every
/// framework on its conventions (Rack, WSGI, PHP), maps `-` to `_`, so
/// `Idempotency_Key` and `Idempotency-Key` both arrive as `HTTP_IDEMPOTENCY_KEY`:
/// a header the proxy does not recognize would be read upstream as one it does.
///
/// Whatever the choice, a name that maps onto `Idempotency-Key`,
/// `Authorization`, the principal header, `Host`, `Content-Length`,
/// `Content-Type`, `Transfer-Encoding`, a method-override header or
/// `X-Forwarded-*` / `Forwarded`, or onto another header of the same request, is
/// never forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum UnderscoreHeaders {
    /// Removed before the layer and the upstream see them (the default; nginx's
    /// `underscores_in_headers off`).
    #[default]
    Drop,
    /// `400 underscore-header` (Envoy's `headers_with_underscores_action:
    /// REJECT_REQUEST`).
    Reject,
    /// Forwarded, except the ones that map onto a header above.
    Forward,
}

/// What to do with a method-override header (`X-HTTP-Method-Override` and its
/// cousins, [`METHOD_OVERRIDE_HEADERS`]). An upstream that honours it runs
/// another method than the one the proxy covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum MethodOverride {
    /// `400 ambiguous-method` (the default).
    #[default]
    Refuse,
    /// The request is that method: matched, covered and forwarded as it (the
    /// override header removed), as an upstream that honours the header reads
    /// it. Decided by the route the overriding method matches.
    Honour,
}

/// What to do with content on a `GET`, `HEAD` or `OPTIONS` request. An upstream
/// that never reads such a body (Python's `http.server` with keep-alive, many
/// small servers) parses it as the next request on the pooled connection — a
/// request the layer never saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum SafeMethodBodies {
    /// `400 unexpected-body` (the default).
    #[default]
    Refuse,
    /// Forwarded, for an upstream known to read them.
    Forward,
}

/// The proxy-wide settings of the guard.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) path_policy: PathPolicy,
    pub(crate) underscore_headers: UnderscoreHeaders,
    /// The header `--principal header:NAME` reads, protected like ours.
    pub(crate) principal_header: Option<HeaderName>,
}

/// A request the guard let through, in the spelling everyone reads.
pub(crate) struct Admitted {
    /// The canonical path routes match.
    pub(crate) path: CanonicalPath,
    /// The method an override named, when there was one (to be decided by the
    /// route it matches).
    pub(crate) overridden: Option<Method>,
}

impl Guard {
    /// Checks and rewrites what does not depend on the route: the target form and
    /// path, the method's spelling, underscored headers, the override header.
    pub(crate) fn admit<B>(&self, request: &mut Request<B>) -> Result<Admitted, ProblemDetails> {
        if request.method() == Method::CONNECT {
            return Err(problem::unsupported_target("CONNECT (a tunnel)"));
        }
        if request.uri().path() == "*" {
            return Err(problem::unsupported_target("the asterisk form (OPTIONS *)"));
        }
        let path = canonicalize(request.uri().path(), &self.path_policy)
            .map_err(|why| problem::ambiguous_path(&why))?;
        check_method_spelling(request.method())?;
        self.clean_underscored(request.headers_mut())?;
        let overridden = method_override(request.headers())?;
        Ok(Admitted { path, overridden })
    }

    /// Removes, refuses or keeps the headers whose names contain `_`.
    fn clean_underscored(&self, headers: &mut HeaderMap) -> Result<(), ProblemDetails> {
        let underscored: Vec<HeaderName> = headers
            .keys()
            .filter(|name| name.as_str().contains('_'))
            .filter(|name| self.principal_header.as_ref() != Some(*name))
            .cloned()
            .collect();
        for name in underscored {
            let dashed = name.as_str().replace('_', "-");
            let shadows = self.is_protected(&dashed) || headers.contains_key(dashed.as_str());
            match self.underscore_headers {
                UnderscoreHeaders::Reject => return Err(problem::underscore_header(&name)),
                UnderscoreHeaders::Forward if !shadows => {}
                UnderscoreHeaders::Drop | UnderscoreHeaders::Forward => {
                    headers.remove(&name);
                }
            }
        }
        Ok(())
    }

    /// Whether `dashed` (a lower-case header name) is one the proxy or a framework
    /// behind it acts on, so that no look-alike may reach the upstream.
    fn is_protected(&self, dashed: &str) -> bool {
        let ours = [
            &IDEMPOTENCY_KEY,
            &AUTHORIZATION,
            &HOST,
            &CONTENT_LENGTH,
            &http::header::CONTENT_TYPE,
            &TRANSFER_ENCODING,
            &X_FORWARDED_FOR,
            &X_FORWARDED_PROTO,
            &X_FORWARDED_HOST,
            &http::header::FORWARDED,
        ];
        ours.iter().any(|name| name.as_str() == dashed)
            || METHOD_OVERRIDE_HEADERS.iter().any(|name| name == dashed)
            || dashed.starts_with("x-forwarded-")
            || self
                .principal_header
                .as_ref()
                .is_some_and(|name| name.as_str().replace('_', "-") == dashed)
    }
}

/// A standard method spelled in another case (`post`) is refused: HTTP methods
/// are case-sensitive, so the layer would not cover it, while servers that
/// upper-case the method would run it as `POST`.
fn check_method_spelling(method: &Method) -> Result<(), ProblemDetails> {
    const STANDARD: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "CONNECT",
    ];
    let name = method.as_str();
    match STANDARD
        .iter()
        .find(|standard| standard.eq_ignore_ascii_case(name) && **standard != name)
    {
        Some(standard) => Err(problem::ambiguous_method(format!(
            "the method {name:?} is {standard} in another case; send {standard}"
        ))),
        None => Ok(()),
    }
}

/// The method an override header names, upper-cased as frameworks do; an error
/// when several lines or headers name one, or the value is not a method.
fn method_override(headers: &HeaderMap) -> Result<Option<Method>, ProblemDetails> {
    // One pass over the names first: nearly no request has one, and the pass
    // costs less than a lookup of each of the three.
    if !headers
        .keys()
        .any(|name| METHOD_OVERRIDE_HEADERS.contains(name))
    {
        return Ok(None);
    }
    let values: Vec<&HeaderValue> = METHOD_OVERRIDE_HEADERS
        .iter()
        .flat_map(|name| headers.get_all(name))
        .collect();
    match values.as_slice() {
        [] => Ok(None),
        [value] => value
            .to_str()
            .ok()
            .map(|v| v.trim().to_ascii_uppercase())
            .filter(|v| !v.is_empty() && !v.contains(','))
            .and_then(|v| Method::from_bytes(v.as_bytes()).ok())
            .map(Some)
            .ok_or_else(|| {
                problem::ambiguous_method("the method-override header does not name one method")
            }),
        _ => Err(problem::ambiguous_method(
            "more than one method-override header line; send at most one",
        )),
    }
}

/// Applies a method override the route honours: the request becomes that
/// method, and no override header is left for the upstream to read again.
pub(crate) fn honour_override<B>(request: &mut Request<B>, method: Method) {
    *request.method_mut() = method;
    for name in &METHOD_OVERRIDE_HEADERS {
        request.headers_mut().remove(name);
    }
}

/// Whether `request` is a safe method with content: a non-empty
/// `Content-Length`, any `Transfer-Encoding`, or a body that is not over already
/// (HTTP/2 DATA frames).
pub(crate) fn has_safe_method_content<B: http_body::Body>(request: &Request<B>) -> bool {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    let declared = request
        .headers()
        .get_all(CONTENT_LENGTH)
        .iter()
        .any(|length| length.as_bytes() != b"0")
        || request.headers().contains_key(TRANSFER_ENCODING);
    safe && (declared || !request.body().is_end_stream())
}

/// Puts the canonical path in place of the client's target: origin form, the
/// path as matched (trailing slash as sent), the query unchanged. The authority
/// of an absolute-form target (or HTTP/2's `:authority`) becomes the `Host`, as
/// RFC 9112 §3.2.2 has a server read it. axum's `OriginalUri` is replaced too, so
/// the layer scopes and fingerprints this path, not the client's spelling.
///
/// A target already in that form (nearly every request) is left as it is:
/// rebuilding it would parse and allocate the same URI again.
pub(crate) fn rewrite_target<B>(request: &mut Request<B>, path: &CanonicalPath) {
    if let Some(host) = request
        .uri()
        .authority()
        .and_then(|authority| HeaderValue::try_from(authority.as_str()).ok())
    {
        request.headers_mut().insert(HOST, host);
    }
    let origin_form = request.uri().scheme().is_none() && request.uri().authority().is_none();
    if origin_form && request.uri().path() == path.forwarded() {
        // An outer router's `OriginalUri` (one that nested the proxy under a
        // prefix) still gives way to the target the upstream gets.
        let stale = request
            .extensions()
            .get::<axum::extract::OriginalUri>()
            .is_some_and(|original| original.0 != *request.uri());
        if stale {
            let uri = request.uri().clone();
            request
                .extensions_mut()
                .insert(axum::extract::OriginalUri(uri));
        }
        return;
    }
    let joined = match request.uri().query() {
        Some(query) => format!("{}?{query}", path.forwarded()),
        None => path.forwarded().into_owned(),
    };
    // A canonical path is a valid origin-form path, and the query came from a
    // parsed URI: the join parses. Should it not, the path alone still does.
    let path_and_query = PathAndQuery::try_from(joined)
        .or_else(|_| PathAndQuery::try_from(path.forwarded().as_ref()))
        .unwrap_or_else(|_| PathAndQuery::from_static("/"));
    let uri = Uri::from(path_and_query);
    request
        .extensions_mut()
        .insert(axum::extract::OriginalUri(uri.clone()));
    *request.uri_mut() = uri;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(underscores: UnderscoreHeaders) -> Guard {
        Guard {
            path_policy: PathPolicy::STRICT,
            underscore_headers: underscores,
            principal_header: Some(HeaderName::from_static("x-user")),
        }
    }

    fn request(method: &str, target: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().method(method).uri(target);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn targets_become_canonical_and_origin_form() {
        let guard = guard(UnderscoreHeaders::Drop);
        let mut r = request(
            "POST",
            "http://api.example//x/../payments/?a=%41",
            &[("host", "other")],
        );
        let admitted = guard.admit(&mut r).unwrap();
        assert_eq!(admitted.path.as_str(), "/payments");
        rewrite_target(&mut r, &admitted.path);
        assert_eq!(r.uri(), "/payments/?a=%41");
        assert_eq!(
            r.headers()[HOST],
            "api.example",
            "the target's authority wins"
        );
        let original = r.extensions().get::<axum::extract::OriginalUri>().unwrap();
        assert_eq!(original.0, "/payments/?a=%41");
        // Already canonical and in origin form: kept as it is; an outer
        // router's original URI (the proxy nested under a prefix) gives way.
        let mut r = request("POST", "/payments/?a=%41", &[("host", "api.example")]);
        r.extensions_mut().insert(axum::extract::OriginalUri(
            "/api/payments/?a=%41".parse().unwrap(),
        ));
        let admitted = guard.admit(&mut r).unwrap();
        rewrite_target(&mut r, &admitted.path);
        assert_eq!(r.uri(), "/payments/?a=%41");
        assert_eq!(r.headers()[HOST], "api.example");
        let original = r.extensions().get::<axum::extract::OriginalUri>().unwrap();
        assert_eq!(original.0, "/payments/?a=%41");
        for refused in ["/a%2Fb", "/..;/a", "/%2e%2e/a", "/../a"] {
            let mut r = request("POST", refused, &[]);
            let problem = guard.admit(&mut r).err().expect(refused);
            assert!(problem.type_uri.ends_with("/ambiguous-path"), "{refused}");
        }
        let mut r = request("CONNECT", "api.example:443", &[]);
        assert!(
            guard
                .admit(&mut r)
                .err()
                .unwrap()
                .type_uri
                .ends_with("/unsupported-target")
        );
        let mut r = request("OPTIONS", "*", &[]);
        assert!(
            guard
                .admit(&mut r)
                .err()
                .unwrap()
                .type_uri
                .ends_with("/unsupported-target")
        );
    }

    #[test]
    fn methods_are_spelled_once() {
        let guard = guard(UnderscoreHeaders::Drop);
        for method in ["post", "Post", "gEt"] {
            let mut r = request(method, "/a", &[]);
            assert!(
                guard
                    .admit(&mut r)
                    .err()
                    .unwrap()
                    .type_uri
                    .ends_with("/ambiguous-method")
            );
        }
        let mut r = request("PURGE", "/a", &[]);
        assert!(
            guard.admit(&mut r).is_ok(),
            "an extension method is its own"
        );
        let mut r = request("PUT", "/a", &[("x-http-method-override", "post")]);
        assert_eq!(guard.admit(&mut r).unwrap().overridden, Some(Method::POST));
        for headers in [
            &[("x-http-method", "POST"), ("x-method-override", "POST")][..],
            &[("x-http-method-override", "POST, PUT")],
            &[("x-http-method-override", "")],
        ] {
            let mut r = request("PUT", "/a", headers);
            assert!(guard.admit(&mut r).is_err(), "{headers:?}");
        }
    }

    #[test]
    fn underscored_headers_never_shadow_ours() {
        let headers = [
            ("idempotency_key", "raw"),
            ("x_forwarded_for", "1.2.3.4"),
            ("x_http_method_override", "POST"),
            ("authorization_", "x"),
            ("x_user", "mallory"),
            ("x_custom", "1"),
            ("x-custom", "2"),
            ("x_other", "3"),
            ("x-user", "alice"),
        ];
        let left = |underscores| {
            let mut r = request("POST", "/a", &headers);
            guard(underscores).admit(&mut r).map(|_| {
                let mut names: Vec<String> =
                    r.headers().keys().map(|n| n.as_str().to_owned()).collect();
                names.sort();
                names
            })
        };
        assert_eq!(
            left(UnderscoreHeaders::Drop).unwrap(),
            ["x-custom", "x-user"]
        );
        assert_eq!(
            left(UnderscoreHeaders::Forward).unwrap(),
            ["authorization_", "x-custom", "x-user", "x_other"]
        );
        assert!(left(UnderscoreHeaders::Reject).is_err());
    }

    #[test]
    fn content_on_safe_methods_is_seen_however_it_is_framed() {
        let with = |method: &str, headers: &[(&str, &str)], body: &'static str| {
            let mut builder = Request::builder().method(method).uri("/a");
            for (name, value) in headers {
                builder = builder.header(*name, *value);
            }
            has_safe_method_content(&builder.body(axum::body::Body::from(body)).unwrap())
        };
        assert!(with("GET", &[("content-length", "5")], "hello"));
        assert!(with("HEAD", &[("transfer-encoding", "chunked")], ""));
        assert!(with("OPTIONS", &[], "x"), "a body with no length header");
        assert!(!with("GET", &[("content-length", "0")], ""));
        assert!(!with("GET", &[], ""));
        assert!(!with("POST", &[("content-length", "5")], "hello"));
    }
}
