//! Whether a replay's content coding is acceptable to the retry (PROTOCOL §7,
//! RFC 9110 §12.5.3): a server must not send a coding the request's
//! `Accept-Encoding` does not accept. The first request may have accepted gzip
//! and its retry only identity; the stored bytes are then decoded for the retry
//! (the layer does it, for the codings it can decode). Pure: header text in,
//! answer out.

/// Whether a response in `coding` (a `Content-Encoding` value; `None` or
/// `identity` for none) is acceptable under `accept_encoding` (the request's
/// `Accept-Encoding` lines, joined; `None` when it sent none).
///
/// No `Accept-Encoding` accepts any coding; an empty one only identity. A listed
/// coding is acceptable unless its `q` is 0; an unlisted one as `*` says, and
/// identity is acceptable unless `identity;q=0` or `*;q=0` excludes it. Several
/// codings (`gzip, br` applied in turn) must each be acceptable.
///
/// ```
/// use idemgate_core::encoding::acceptable;
/// assert!(acceptable(Some("gzip"), Some("gzip, deflate")));
/// assert!(!acceptable(Some("gzip"), Some("identity")));
/// assert!(acceptable(None, Some("identity")));
/// assert!(acceptable(Some("gzip"), None));
/// ```
pub fn acceptable(coding: Option<&str>, accept_encoding: Option<&str>) -> bool {
    let Some(accept) = accept_encoding else {
        return true;
    };
    let codings: Vec<String> = coding
        .unwrap_or_default()
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect();
    let ranges: Vec<(String, bool)> = accept
        .split(',')
        .filter_map(|range| {
            let mut parts = range.split(';');
            let name = parts.next()?.trim().to_ascii_lowercase();
            if name.is_empty() {
                return None;
            }
            let refused = parts.any(|param| {
                let (key, value) = param.split_once('=').unwrap_or((param, ""));
                key.trim().eq_ignore_ascii_case("q")
                    && value.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
            });
            Some((name, !refused))
        })
        .collect();
    let verdict = |name: &str| {
        ranges
            .iter()
            .find(|(range, _)| range == name)
            .or_else(|| ranges.iter().find(|(range, _)| range == "*"))
            .map(|(_, accepted)| *accepted)
    };
    if codings.is_empty() {
        return verdict("identity").unwrap_or(true);
    }
    // `x-gzip` is gzip (RFC 9110 §8.4.1.3).
    codings.iter().all(|coding| {
        let name = if coding == "x-gzip" { "gzip" } else { coding };
        verdict(name)
            .or_else(|| (name == "gzip").then(|| verdict("x-gzip")).flatten())
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codings_follow_rfc_9110() {
        // No header: anything goes.
        assert!(acceptable(Some("br"), None));
        // An empty header: identity only.
        assert!(!acceptable(Some("gzip"), Some("")));
        assert!(acceptable(None, Some("")));
        // Listed, with and without q.
        assert!(acceptable(Some("gzip"), Some("br;q=1.0, gzip;q=0.8")));
        assert!(!acceptable(Some("gzip"), Some("gzip;q=0, br")));
        assert!(!acceptable(Some("GZIP"), Some("identity")));
        // The wildcard.
        assert!(acceptable(Some("zstd"), Some("*")));
        assert!(!acceptable(Some("zstd"), Some("gzip, *;q=0")));
        // Identity: acceptable unless excluded.
        assert!(acceptable(Some("identity"), Some("gzip")));
        assert!(!acceptable(None, Some("identity;q=0")));
        assert!(!acceptable(None, Some("*;q=0")));
        assert!(acceptable(None, Some("*;q=0, identity")));
        // Stacked codings: each must be accepted.
        assert!(acceptable(Some("deflate, gzip"), Some("gzip, deflate")));
        assert!(!acceptable(Some("deflate, gzip"), Some("gzip")));
        // x-gzip is gzip.
        assert!(acceptable(Some("x-gzip"), Some("gzip")));
        assert!(acceptable(Some("gzip"), Some("x-gzip")));
    }
}
