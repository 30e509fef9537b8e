//! Names on the wire that the server side and the client side both act on, kept in
//! one place so the two cannot drift: the replay marker and the problem types a
//! client must tell apart (PROTOCOL §6, §7, §10, §14).

use http::header::HeaderName;

/// Marks every replayed response (`Idempotent-Replayed: true`).
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Where the problem types are documented; every `type` URI starts with it.
pub const PROBLEM_BASE: &str = "https://idemgate.dev/problems/";

/// The slug of the 422 "key reused with a different request" problem.
pub const KEY_REUSED: &str = "key-reused";

/// The slug of the 409 "request in progress" problem.
pub const IN_PROGRESS: &str = "in-progress";

/// The full `type` URI of the problem with this slug.
///
/// ```
/// use idemgate_core::wire::{problem_type, KEY_REUSED};
/// assert_eq!(problem_type(KEY_REUSED), "https://idemgate.dev/problems/key-reused");
/// ```
pub fn problem_type(slug: &str) -> String {
    format!("{PROBLEM_BASE}{slug}")
}
