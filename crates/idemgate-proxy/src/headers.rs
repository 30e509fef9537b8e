//! What a proxy must do to headers (RFC 9110 §7.6): drop the hop-by-hop ones in
//! both directions, tell the upstream who the client was (`X-Forwarded-*`), and
//! put the derived key in place of the client's `Idempotency-Key`.

use std::net::IpAddr;

use http::header::Entry;
use http::header::{CONNECTION, HOST};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The header the client's key arrives in, and the derived key leaves in.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The client addresses, each proxy appending the one it saw.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// The scheme the client spoke to the first proxy.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// The `Host` the client asked for.
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Removes the hop-by-hop headers: `Connection` and every header it names,
/// `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
/// `HTTP2-Settings` and `Proxy-*`
/// (RFC 9110 §7.6.1). They describe one connection, not the message; forwarding
/// them would let a client steer the proxy's connection to the upstream.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // The names `Connection` lists beyond the fixed ones that the message
    // carries: nearly always none, and then nothing is allocated. Tokens are
    // matched once here (a lookup of the text, in any case), not against
    // every name.
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|token| !is_hop_by_hop(token) && headers.contains_key(*token))
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect();
    let doomed = |name: &HeaderName| is_hop_by_hop(name.as_str()) || listed.contains(name);
    // Which names go, and whether they are the last ones, from one pass.
    let mut count = 0;
    let mut kept_after_one = false;
    for name in headers.keys() {
        if doomed(name) {
            count += 1;
        } else if count > 0 {
            kept_after_one = true;
        }
    }
    if count == 0 {
        // Most requests: nothing to remove.
        return;
    }
    if !kept_after_one {
        // The last names: a removal moves the last name into the hole, and
        // from the end there is none to move. Most responses end with their
        // `Connection` (and `Keep-Alive`).
        for _ in 0..count {
            if let Some(last) = headers.keys().last().cloned() {
                headers.remove(&last);
            }
        }
        return;
    }
    // Rebuilt rather than removed from, which would move the last header into
    // each hole: the headers that stay keep the order they came in.
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| doomed(name))
        .cloned()
        .collect();
    let all = std::mem::replace(headers, HeaderMap::with_capacity(headers.len()));
    let mut current = None;
    for (name, value) in all {
        // `None`: another value of the header before it.
        if name.is_some() {
            current = name;
        }
        if let Some(name) = &current
            && !doomed.contains(name)
        {
            headers.append(name.clone(), value);
        }
    }
}

/// The headers hop-by-hop whatever `Connection` says, besides every `Proxy-*`
/// (RFC 9110 §7.6.1), and `HTTP2-Settings` — the h2c upgrade's settings (RFC
/// 9113 §3.2.1, hop-by-hop by definition), an upgrade this proxy never
/// carries. Lower case, as header names are.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

/// Whether `name` — a header name, or a token of `Connection` in any case — is
/// hop-by-hop whatever `Connection` says. Compared as text: every name of
/// every message goes through it, twice per request.
fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop_by_hop| name.eq_ignore_ascii_case(hop_by_hop))
        || name
            .get(..6)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case("proxy-"))
}

/// Appends what this hop saw to `X-Forwarded-For` (the client address),
/// `X-Forwarded-Proto` (the scheme it was spoken to in) and `X-Forwarded-Host`
/// (the `Host` the client sent), after whatever proxies in front appended: the
/// first entry of each is the original client's.
pub fn add_forwarded(headers: &mut HeaderMap, client: Option<IpAddr>, proto: &'static str) {
    // Room for the three at once: the map grows (and rehashes) once at most.
    headers.reserve(3);
    if let Some(client) = client.and_then(ip_header_value) {
        append(headers, X_FORWARDED_FOR, client);
    }
    append(headers, X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    if let Some(host) = headers.get(HOST).cloned() {
        append(headers, X_FORWARDED_HOST, host);
    }
}

/// An address as a header value, written on the stack and copied once (not
/// through a growing `String`: this runs on every forwarded request).
fn ip_header_value(ip: IpAddr) -> Option<HeaderValue> {
    use std::io::Write as _;
    if let IpAddr::V4(v4) = ip {
        // Digits by hand: the formatting machinery costs more than the rest
        // of the X-Forwarded-* work together.
        let mut text = [0u8; 15];
        let mut length = 0;
        for (index, octet) in v4.octets().into_iter().enumerate() {
            if index > 0 {
                text[length] = b'.';
                length += 1;
            }
            for (place, shown) in [(100, octet >= 100), (10, octet >= 10), (1, true)] {
                if shown {
                    text[length] = b'0' + octet / place % 10;
                    length += 1;
                }
            }
        }
        return HeaderValue::from_bytes(&text[..length]).ok();
    }
    // The longest text form, an IPv4-mapped IPv6 address, is 45 bytes.
    let mut text = [0u8; 48];
    let mut cursor = std::io::Cursor::new(&mut text[..]);
    write!(cursor, "{ip}").ok()?;
    let length = usize::try_from(cursor.position()).ok()?;
    HeaderValue::from_bytes(&text[..length]).ok()
}

/// `name: earlier, value`, one line, as proxies write these lists. The usual
/// case — no earlier value — inserts `value` as it is, without a copy; either
/// way the name is looked up once.
fn append(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    let mut earlier = match headers.entry(name) {
        Entry::Vacant(vacant) => {
            vacant.insert(value);
            return;
        }
        Entry::Occupied(occupied) => occupied,
    };
    let mut joined = Vec::new();
    for earlier in earlier.iter() {
        joined.extend_from_slice(earlier.as_bytes());
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(value.as_bytes());
    if let Ok(joined) = HeaderValue::from_bytes(&joined) {
        earlier.insert(joined);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    /// `headers` in the order they would be written.
    fn pairs(headers: &HeaderMap) -> Vec<(&str, &str)> {
        headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.to_str().unwrap()))
            .collect()
    }

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_lists_go() {
        let mut headers = map(&[
            ("accept", "*/*"),
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("x-kept", "1"),
            ("x-kept", "2"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("content-type", "application/json"),
            ("authorization", "Bearer t"),
        ]);
        remove_hop_by_hop(&mut headers);
        // What stays keeps its order, every value of it too.
        assert_eq!(
            pairs(&headers),
            [
                ("accept", "*/*"),
                ("x-kept", "1"),
                ("x-kept", "2"),
                ("content-type", "application/json"),
                ("authorization", "Bearer t"),
            ]
        );
    }

    #[test]
    fn hop_by_hop_headers_at_the_end_go_and_the_rest_keep_their_order() {
        let mut headers = map(&[
            ("server", "nginx"),
            ("set-cookie", "a=1"),
            ("content-type", "application/json"),
            ("set-cookie", "b=2"),
            ("content-length", "3"),
            ("connection", "keep-alive, x-hop"),
            ("keep-alive", "timeout=5"),
            ("x-hop", "1"),
        ]);
        remove_hop_by_hop(&mut headers);
        assert_eq!(
            pairs(&headers),
            [
                ("server", "nginx"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
                ("content-type", "application/json"),
                ("content-length", "3"),
            ]
        );
    }

    #[test]
    fn every_address_form_is_written_whole() {
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "10.200.99.255",
            "255.255.255.255",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:255.255.255.255",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let value = ip_header_value(ip.parse().unwrap()).unwrap();
            assert_eq!(value, ip);
        }
    }

    #[test]
    fn forwarded_headers_append_to_what_came_before() {
        let mut headers = map(&[("host", "api.example"), ("x-forwarded-for", "10.0.0.1")]);
        add_forwarded(&mut headers, Some("127.0.0.2".parse().unwrap()), "http");
        assert_eq!(headers[X_FORWARDED_FOR], "10.0.0.1, 127.0.0.2");
        assert_eq!(headers[X_FORWARDED_PROTO], "http");
        assert_eq!(headers[X_FORWARDED_HOST], "api.example");

        let mut headers = map(&[
            ("host", "b"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "a"),
        ]);
        add_forwarded(&mut headers, None, "http");
        assert_eq!(headers[X_FORWARDED_PROTO], "https, http");
        assert_eq!(headers[X_FORWARDED_HOST], "a, b");
        assert!(!headers.contains_key(X_FORWARDED_FOR));
    }
}
