//! The proxy guard's attack tables, written once as data
//! (`data/guard/cases.json`, `data/guard/routes.toml`) and read by both guard
//! suites: the in-process router's (`crates/idemgate-proxy/tests/guard`) and the
//! real binary's (`crates/idemgate-server/tests/e2e/proxy_guard.rs`). A case
//! added to the file is sent by both; each suite keeps only the assertions that
//! are its own.

use std::sync::LazyLock;

use serde_json::Value;

use crate::raw_client::{RawRequest, RawResponse};
use crate::upstreams::Seen;

/// The route file both suites run behind: `POST /payments` requires a key,
/// `POST /webhooks/*` is disabled, `PUT /profiles/{id}` requires a key. A suite
/// appends only routes of its own.
pub const ROUTES: &str = include_str!("../data/guard/routes.toml");

static CASES: LazyLock<Value> = LazyLock::new(|| {
    serde_json::from_str(include_str!("../data/guard/cases.json"))
        .expect("data/guard/cases.json is JSON")
});

/// The `cases` array of the table `table`.
fn cases(table: &str) -> &'static [Value] {
    CASES[table]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("cases.json: {table}.cases is an array"))
}

fn string<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("cases.json: {what} is a string: {value}"))
}

/// What a keyless spelling of `POST /payments` must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentOutcome {
    /// It is the payments route under every setting: refused `missing-key`.
    MissingKey,
    /// Refused, or forwarded as something the upstream does not run as
    /// `POST /payments`, depending on the upstream and the settings.
    RefusedOrElsewhere,
}

/// A spelling of `/payments` and what it must get when sent keyless.
#[derive(Debug, Clone)]
pub struct PaymentSpelling {
    /// The request target, as sent.
    pub target: &'static str,
    /// What it must get.
    pub outcome: PaymentOutcome,
}

impl PaymentSpelling {
    /// Asserts that `answer`, to this spelling sent keyless, is what the table
    /// says: 400 or 201, and `missing-key` where the spelling is the payments
    /// route. What was sent and answered, for the keyless-run check's message.
    pub fn check(&self, answer: &RawResponse) -> String {
        let target = self.target;
        assert!(
            answer.status == 400 || answer.status == 201,
            "{target}: {} {}",
            answer.status,
            answer.text()
        );
        if self.outcome == PaymentOutcome::MissingKey {
            assert_eq!(
                answer.problem().as_deref(),
                Some("missing-key"),
                "{target} is the payments route"
            );
        }
        format!("{target} → {} {:?}", answer.status, answer.problem())
    }
}

/// Spellings of `POST /payments`, plain and hostile: each sent keyless is
/// answered 400 or 201, and the upstream never runs a keyless `POST /payments`.
pub fn payment_spellings() -> Vec<PaymentSpelling> {
    cases("payment_spellings")
        .iter()
        .map(|case| PaymentSpelling {
            target: string(&case["target"], "payment_spellings.target"),
            outcome: match string(&case["outcome"], "payment_spellings.outcome") {
                "missing-key" => PaymentOutcome::MissingKey,
                "refused-or-elsewhere" => PaymentOutcome::RefusedOrElsewhere,
                other => panic!("cases.json: an unknown payment outcome {other:?}"),
            },
        })
        .collect()
}

/// The target the one-key suite sends first with its key.
pub fn first_order_spelling() -> &'static str {
    string(&CASES["order_spellings"]["first"], "order_spellings.first")
}

/// Spellings of [`first_order_spelling`] sent again with the same key (with
/// case-insensitive paths): each is the same operation (replayed) or refused
/// (`422`, `400 ambiguous-path`); the upstream runs the operation once.
pub fn order_spellings() -> Vec<&'static str> {
    cases("order_spellings")
        .iter()
        .map(|case| string(case, "order_spellings case"))
        .collect()
}

/// `request` with every underscored look-alike of the table set on it, the
/// client's raw key where the table says `{raw_key}`.
pub fn with_lookalikes(request: RawRequest, raw_key: &str) -> RawRequest {
    cases("lookalike_headers")
        .iter()
        .fold(request, |request, case| {
            let (name, value) = lookalike(case, raw_key);
            request.header(name, &value)
        })
}

/// Asserts that no look-alike reached `seen` as a header one of them shadows:
/// no value of the idempotency key, the principal or an `X-Forwarded-*` header
/// starts with a look-alike's value (the raw key, a second principal, a forged
/// address, host or scheme); and that the principal header arrived once, as
/// `principal` (name, value) was sent.
pub fn assert_no_lookalike_arrived(seen: &Seen, raw_key: &str, principal: (&str, &str)) {
    let (header, sent) = principal;
    assert_eq!(
        seen.headers_named(header),
        [sent.as_bytes()],
        "one principal"
    );
    let shadowing: Vec<(&str, &str, String)> = cases("lookalike_headers")
        .iter()
        .filter_map(|case| {
            let shadows = case["shadows"].as_str()?;
            let (name, forged) = lookalike(case, raw_key);
            Some((shadows, name, forged))
        })
        .collect();
    for (shadows, _, _) in &shadowing {
        for value in seen.headers_named(shadows) {
            for (_, name, forged) in &shadowing {
                assert!(
                    !value.starts_with(forged.as_bytes()),
                    "{name}: {forged:?} reached the upstream as {shadows}: {:?}",
                    String::from_utf8_lossy(value)
                );
            }
        }
    }
}

/// A look-alike's name and value.
fn lookalike(case: &'static Value, raw_key: &str) -> (&'static str, String) {
    let name = string(&case["name"], "lookalike_headers.name");
    let value = string(&case["value"], "lookalike_headers.value").replace("{raw_key}", raw_key);
    (name, value)
}

/// Asserts that `answer`, to a request with the wrongly framed chunked `body`,
/// blames the client: 400, never 502.
pub fn assert_framing_refused(body: &[u8], answer: &RawResponse) {
    assert_eq!(
        answer.status,
        400,
        "{:?}: {}",
        String::from_utf8_lossy(body),
        answer.text()
    );
}

/// Chunked bodies the client framed wrongly: each a 400, never a 502, and
/// nothing runs.
pub fn bad_chunked_bodies() -> Vec<&'static [u8]> {
    cases("bad_chunked_bodies")
        .iter()
        .map(|case| string(case, "bad_chunked_bodies case").as_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_reads() {
        let payments = payment_spellings();
        assert!(payments.len() > 30);
        assert!(payments.iter().any(|case| case.target == "/payments#x"));
        assert_eq!(
            payments
                .iter()
                .filter(|case| case.outcome == PaymentOutcome::MissingKey)
                .count(),
            6
        );
        assert_eq!(first_order_spelling(), "/orders");
        assert!(order_spellings().contains(&"/orders/%2e"));
        assert_eq!(bad_chunked_bodies()[0], b"zz\r\nhello\r\n0\r\n\r\n");
        let request = with_lookalikes(RawRequest::new("POST", "/"), "k-1");
        let bytes = String::from_utf8(request.bytes()).unwrap();
        assert!(bytes.contains("Idempotency_Key: k-1\r\n"), "{bytes}");
        assert!(ROUTES.contains("path = \"/payments\""));
    }
}
