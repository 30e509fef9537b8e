//! What an answer's headers say about the operation, read the one way the
//! retry policy and the errors both need: whether it is a replay, and how long
//! the server asks a retry to wait.

use std::time::Duration;

use http::HeaderMap;
use http::header::RETRY_AFTER;
use idemgate_core::wire::IDEMPOTENT_REPLAYED;

/// `Idempotent-Replayed: true`: the server's stored outcome, not a fresh run.
pub(crate) fn is_replayed(headers: &HeaderMap) -> bool {
    headers
        .get(&IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"true"))
}

/// `Retry-After` in seconds (the form idemgate sends): delay-seconds, `1*DIGIT`
/// (RFC 9110 §10.2.3), so no sign and no fraction. An HTTP-date is not read: the
/// retry then waits its backoff instead. A number of seconds too large to hold is
/// the longest wait (which `max_retry_after` caps).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.as_bytes().trim_ascii();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let seconds = std::str::from_utf8(value).ok()?.parse().unwrap_or(u64::MAX);
    Some(Duration::from_secs(seconds))
}
