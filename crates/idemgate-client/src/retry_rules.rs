//! The cases of `clients/retry-rules.json`, the retry rules every client of this
//! repository runs (clients/js and clients/python load the same file): the
//! verdict on an answer, `Retry-After`, which requests may be sent again, the waits,
//! the keys an operation accepts and the error a final answer becomes. The file's
//! `$comment` says what each section holds.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use idemgate_core::key::IDEMPOTENCY_KEY;
use serde::Deserialize;

use crate::answer::retry_after;
use crate::case_files::PolicySettings;
use crate::error::Error;
use crate::operation::Operation;
use crate::policy::{Attempts, RetryPolicy, Verdict, judge_response, may_have_run};

const RULES: &str = include_str!("../../../clients/retry-rules.json");

#[derive(Deserialize)]
struct Rules {
    defaults: PolicySettings,
    responses: Vec<ResponseCase>,
    retry_after: Vec<RetryAfterCase>,
    retryable: Vec<RetryableCase>,
    may_have_run: Vec<MayHaveRunCase>,
    waits: Vec<WaitCase>,
    jitter: Vec<JitterCase>,
    timeouts: Vec<TimeoutCase>,
    policies: Vec<PolicyCase>,
    keys: Vec<KeyCase>,
    answers: Vec<AnswerCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseCase {
    status: u16,
    headers: BTreeMap<String, String>,
    retry: bool,
    after_ms: Option<u64>,
    #[serde(default, rename = "why")]
    _why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryAfterCase {
    value: String,
    ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryableCase {
    method: String,
    keyed: bool,
    retried: bool,
    #[serde(default, rename = "why")]
    _why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MayHaveRunCase {
    status: u16,
    may_have_run: bool,
    #[serde(default, rename = "why")]
    _why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitCase {
    policy: PolicySettings,
    #[serde(default = "post")]
    method: String,
    #[serde(default = "yes")]
    keyed: bool,
    attempts: u32,
    answer: Option<Answer>,
    #[serde(default, with = "serde_with_null")]
    wait_ms: Option<Option<u64>>,
    backoff_up_to_ms: Option<u64>,
    #[serde(default, rename = "why")]
    _why: Option<String>,
}

/// `"wait_ms": null` (no next attempt) told apart from no `wait_ms` at all.
mod serde_with_null {
    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<u64>>, D::Error> {
        Option::<u64>::deserialize(d).map(Some)
    }
}

fn post() -> String {
    "POST".to_owned()
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JitterCase {
    policy: PolicySettings,
    draws: usize,
    some_below_ms: u64,
    some_above_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeoutCase {
    policy: PolicySettings,
    at_most_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyCase {
    settings: PolicySettings,
    max_backoff_ms: Option<u64>,
    #[serde(default = "yes")]
    valid: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyCase {
    key: String,
    #[serde(default = "once")]
    repeat: usize,
    valid: bool,
    digest: Option<String>,
    #[serde(default, rename = "why")]
    _why: Option<String>,
}

fn once() -> usize {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerCase {
    status: u16,
    #[serde(rename = "status_text")]
    _status_text: String,
    headers: BTreeMap<String, String>,
    body: String,
    ran_before: bool,
    error: String,
    retry_after_ms: Option<u64>,
    replayed: Option<bool>,
    may_have_run: bool,
    problem: ProblemCase,
    #[serde(default, rename = "why")]
    _why: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProblemCase {
    #[serde(rename = "type")]
    type_uri: String,
    title: Option<String>,
    detail: Option<String>,
}

fn rules() -> Rules {
    serde_json::from_str(RULES).expect("clients/retry-rules.json")
}

fn headers(pairs: &BTreeMap<String, String>) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
        .collect()
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap()
}

fn ms(duration: Duration) -> u128 {
    duration.as_millis()
}

/// A request of `method` with a buffered body, with a key or not.
pub(crate) fn request(method: &str, keyed: bool) -> reqwest::Request {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = reqwest::Request::new(method, "http://127.0.0.1:1/".parse().unwrap());
    if keyed {
        request
            .headers_mut()
            .insert(&IDEMPOTENCY_KEY, "k".parse().unwrap());
    }
    *request.body_mut() = Some("{}".into());
    request
}

/// `made` attempts of a request sent under `policy`.
fn attempts_made(policy: &RetryPolicy, method: &str, keyed: bool, made: u32) -> Attempts {
    let request = request(method, keyed);
    let mut attempts = Attempts::start(policy, &request).unwrap();
    let mut pending = Some(request);
    for _ in 0..made {
        attempts.next(&mut pending);
    }
    attempts
}

const TRANSPORT_FAILURE: Verdict = Verdict::Retry { after: None };

#[test]
fn responses() {
    for case in rules().responses {
        let expected = if case.retry {
            Verdict::Retry {
                after: case.after_ms.map(Duration::from_millis),
            }
        } else {
            Verdict::Final
        };
        assert_eq!(
            judge_response(status(case.status), &headers(&case.headers)),
            expected,
            "{} {:?}",
            case.status,
            case.headers
        );
    }
}

#[test]
fn retry_after_values() {
    for case in rules().retry_after {
        let headers = headers(&BTreeMap::from([(
            "retry-after".to_owned(),
            case.value.clone(),
        )]));
        assert_eq!(
            retry_after(&headers).map(ms),
            case.ms.map(u128::from),
            "{:?}",
            case.value
        );
    }
}

#[test]
fn retryable_requests() {
    for case in rules().retryable {
        let attempts = attempts_made(&RetryPolicy::default(), &case.method, case.keyed, 1);
        assert_eq!(
            attempts.wait_for(TRANSPORT_FAILURE).is_some(),
            case.retried,
            "{} keyed: {}",
            case.method,
            case.keyed
        );
    }
}

#[test]
fn which_answers_may_have_run() {
    for case in rules().may_have_run {
        assert_eq!(
            may_have_run(status(case.status)),
            case.may_have_run,
            "{}",
            case.status
        );
    }
}

#[test]
fn waits() {
    for case in rules().waits {
        let policy = case.policy.policy().expect("a valid policy");
        let attempts = attempts_made(&policy, &case.method, case.keyed, case.attempts);
        let verdict = case.answer.as_ref().map_or(TRANSPORT_FAILURE, |answer| {
            judge_response(status(answer.status), &headers(&answer.headers))
        });
        let wait = attempts.wait_for(verdict).map(ms);
        let what = format!(
            "{:?} after {} attempts, {verdict:?}",
            case.policy, case.attempts
        );
        match (case.wait_ms, case.backoff_up_to_ms) {
            (Some(expected), None) => assert_eq!(wait, expected.map(u128::from), "{what}"),
            // Full jitter (retry-policies draws it): a wait in [0, bound].
            (None, Some(bound)) => {
                let wait = wait.unwrap_or_else(|| panic!("{what}: no next attempt"));
                assert!(wait <= u128::from(bound), "{what}: {wait} ms > {bound} ms");
            }
            _ => panic!("{what}: a wait case names wait_ms or backoff_up_to_ms"),
        }
    }
}

#[test]
fn full_jitter_spreads_the_waits_from_zero() {
    for case in rules().jitter {
        let policy = case.policy.policy().expect("a valid policy");
        let attempts = attempts_made(&policy, "POST", true, 1);
        let waits: Vec<u128> = (0..case.draws)
            .map(|_| ms(attempts.wait_for(TRANSPORT_FAILURE).unwrap()))
            .collect();
        assert!(
            waits.iter().any(|w| *w < u128::from(case.some_below_ms)),
            "{waits:?}"
        );
        assert!(
            waits.iter().any(|w| *w > u128::from(case.some_above_ms)),
            "{waits:?}"
        );
    }
}

#[test]
fn each_attempt_gets_at_most_what_is_left_of_the_deadline() {
    for case in rules().timeouts {
        let policy = case.policy.policy().expect("a valid policy");
        let request = request("POST", true);
        let mut attempts = Attempts::start(&policy, &request).unwrap();
        let sent = attempts.next(&mut Some(request));
        let timeout = ms(*sent.timeout().unwrap());
        assert!(
            timeout <= u128::from(case.at_most_ms),
            "{:?}: {timeout} ms",
            case.policy
        );
    }
}

#[test]
fn the_default_policy() {
    let defaults = rules().defaults;
    let complete = [
        defaults.max_retries,
        defaults.min_backoff_ms,
        defaults.max_backoff_ms,
        defaults.max_retry_after_ms,
        defaults.deadline_ms,
        defaults.attempt_timeout_ms,
    ];
    assert!(complete.iter().all(Option::is_some), "{defaults:?}");
    assert_eq!(defaults.policy(), Some(RetryPolicy::default()));
}

#[test]
fn policies() {
    for case in rules().policies {
        // RetryPolicy's u32 and Duration cannot hold what the other clients
        // refuse at run time; those settings do not convert.
        let policy = case.settings.policy();
        assert_eq!(policy.is_some(), case.valid, "{:?}", case.settings);
        if let Some(policy) = policy {
            let max = case.max_backoff_ms.expect("a valid case's max_backoff_ms");
            assert_eq!(
                ms(policy.backoff_bounds().1),
                u128::from(max),
                "{:?}",
                case.settings
            );
        }
    }
}

#[test]
fn keys() {
    for case in rules().keys {
        let key = case.key.repeat(case.repeat);
        let resumed = Operation::resume(&key);
        assert_eq!(resumed.is_ok(), case.valid, "{key:?}");
        if let Ok(operation) = resumed {
            assert_eq!(operation.key(), key);
            if let Some(digest) = case.digest {
                let shown = format!("{operation:?} {operation}");
                assert!(shown.contains(&digest), "{shown}");
                assert!(!shown.contains(&key), "{shown}");
            }
        }
    }
}

#[test]
fn answers() {
    for case in rules().answers {
        let error = Error::from_answer(
            status(case.status),
            &headers(&case.headers),
            case.body.as_bytes(),
            case.ran_before,
        );
        let what = format!(
            "{} {:?} {:?}: {error:?}",
            case.status, case.headers, case.body
        );
        match (case.error.as_str(), &error) {
            ("key-reused", Error::KeyReused { .. }) => {}
            ("in-progress", Error::StillInProgress { retry_after, .. }) => {
                assert_eq!(
                    retry_after.map(ms),
                    case.retry_after_ms.map(u128::from),
                    "{what}"
                );
            }
            ("rejected", Error::Rejected { replayed, .. }) => {
                assert_eq!(Some(*replayed), case.replayed, "{what}");
            }
            (expected, _) => panic!("{what}: not {expected}"),
        }
        assert_eq!(error.may_have_run(), case.may_have_run, "{what}");
        let problem = error.problem().unwrap();
        assert_eq!(problem.type_uri, case.problem.type_uri, "{what}");
        assert_eq!(problem.title, case.problem.title, "{what}");
        assert_eq!(problem.detail, case.problem.detail, "{what}");
    }
}
