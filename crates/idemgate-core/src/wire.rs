//! Names on the wire that the server side and the client side both act on, kept in
//! one place so the two cannot drift: the replay marker and the problem types a
//! client must tell apart (PROTOCOL §6, §7, §10, §14).

use http::header::HeaderName;

/// Marks every replayed response (`Idempotent-Replayed: true`).
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The default base of the problem types: every `type` URI starts with it unless
/// the operator sets their own (`--problem-type-base`, the layer's
/// `with_problem_type_base`).
///
/// A relative reference with the full path (RFC 9457 §3.1.1 recommends that form
/// for relative `type`s): it resolves against the API that answered, which is the
/// operator's, so the default claims no domain the project does not control.
/// `docs/problems.md` documents every slug.
pub const PROBLEM_BASE: &str = "/problems/";

/// The slug of the 422 "key reused with a different request" problem.
pub const KEY_REUSED: &str = "key-reused";

/// The slug of the 409 "request in progress" problem.
pub const IN_PROGRESS: &str = "in-progress";

/// The full `type` URI of the problem with this slug, under the default base.
///
/// ```
/// use idemgate_core::wire::{problem_type, KEY_REUSED};
/// assert_eq!(problem_type(KEY_REUSED), "/problems/key-reused");
/// ```
pub fn problem_type(slug: &str) -> String {
    format!("{PROBLEM_BASE}{slug}")
}

/// Whether `type_uri` names idemgate's problem `slug` under any base: the
/// operator's base is not known to a client, so the slug is what it compares —
/// the last segment after a `/`, `:` or `#`.
///
/// ```
/// use idemgate_core::wire::{is_problem, KEY_REUSED};
/// assert!(is_problem("/problems/key-reused", KEY_REUSED));
/// assert!(is_problem("https://errors.example.com/idempotency/key-reused", KEY_REUSED));
/// assert!(is_problem("urn:example:key-reused", KEY_REUSED));
/// assert!(!is_problem("https://example.com/not-key-reused", KEY_REUSED));
/// ```
pub fn is_problem(type_uri: &str, slug: &str) -> bool {
    type_uri
        .strip_suffix(slug)
        .is_some_and(|base| base.ends_with(['/', ':', '#']))
}

/// Whether `content_type` is gRPC's: `application/grpc`, or one of its
/// `+proto`/`+json` forms (not `application/grpc-web`, another protocol).
///
/// ```
/// use idemgate_core::wire::is_grpc_content_type;
/// assert!(is_grpc_content_type("application/grpc"));
/// assert!(is_grpc_content_type("Application/GRPC+proto; charset=utf-8"));
/// assert!(!is_grpc_content_type("application/grpc-web"));
/// assert!(!is_grpc_content_type("application/json"));
/// ```
pub fn is_grpc_content_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    let Some((head, rest)) = essence.split_at_checked(16) else {
        return false;
    };
    head.eq_ignore_ascii_case("application/grpc") && (rest.is_empty() || rest.starts_with('+'))
}
