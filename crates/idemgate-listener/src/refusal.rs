//! The listener's own refusals — `503 connection-limit` (a connection shed at the
//! bound, or evicted as its head completed) and `408 body-timeout` — as
//! `application/problem+json` (RFC 9457) under the operator's problem type base
//! ([`ListenerOptions::problem_type_base`]).
//!
//! They are answered below any application, so they cannot be an application's
//! error type: like axum's `serve` and pingora's listeners, this crate knows no
//! idempotency layer. Each refusal is the same bytes for every connection of a
//! listener, so each is rendered once, when the listener is bound, in the
//! members and order an `idemgate::ProblemDetails` has (`type`, `title`,
//! `status`, `detail`); `docs/problems.md` lists them with every other type.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Response, StatusCode, header};

use crate::ListenerOptions;

/// What `Retry-After` says to a connection refused at the bound.
const CONNECTION_LIMIT_RETRY_AFTER: &str = "1";

/// A listener's refusals, rendered once from its options.
#[derive(Debug)]
pub(crate) struct Refusals {
    /// The whole raw HTTP/1.1 answer to a connection shed at the bound.
    shed: Vec<u8>,
    /// The `connection-limit` problem's body.
    connection_limit: Bytes,
    /// The `body-timeout` problem's body.
    body_timeout: Bytes,
}

impl Refusals {
    /// The refusals of a listener with `options`.
    pub(crate) fn new(options: &ListenerOptions) -> Self {
        let base = &*options.problem_type_base;
        let connection_limit = problem_body(
            base,
            StatusCode::SERVICE_UNAVAILABLE,
            "connection-limit",
            "Too many connections",
            "the server has as many connections open as it accepts; retry after Retry-After",
        );
        let body_timeout = problem_body(
            base,
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Request body too slow",
            &format!(
                "the request body did not arrive within {} ms; nothing was done",
                options.body_read_timeout.as_millis()
            ),
        );
        let mut shed = format!(
            "HTTP/1.1 503 Service Unavailable\r\n\
             content-type: application/problem+json\r\n\
             retry-after: {CONNECTION_LIMIT_RETRY_AFTER}\r\n\
             connection: close\r\n\
             content-length: {}\r\n\r\n",
            connection_limit.len()
        )
        .into_bytes();
        shed.extend_from_slice(&connection_limit);
        Self {
            shed,
            connection_limit: Bytes::from(connection_limit),
            body_timeout: Bytes::from(body_timeout),
        }
    }

    /// The answer to a connection over the bound, written raw (no HTTP parsing).
    pub(crate) fn shed(&self) -> &[u8] {
        &self.shed
    }

    /// `503 connection-limit` with `Retry-After`, closing the connection: a
    /// request whose connection was evicted as its head completed.
    pub(crate) fn connection_limit(&self) -> Response<Body> {
        let mut response = problem_response(
            StatusCode::SERVICE_UNAVAILABLE,
            self.connection_limit.clone(),
        );
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(CONNECTION_LIMIT_RETRY_AFTER),
        );
        response
    }

    /// `408 body-timeout`, closing the connection (the rest of the body is unread).
    pub(crate) fn body_timeout(&self) -> Response<Body> {
        problem_response(StatusCode::REQUEST_TIMEOUT, self.body_timeout.clone())
    }
}

/// A problem response that closes its connection.
fn problem_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The problem's JSON object: `type` (`base` and `slug`), `title`, `status`,
/// `detail`, each string escaped by `serde_json`.
fn problem_body(base: &str, status: StatusCode, slug: &str, title: &str, detail: &str) -> Vec<u8> {
    let string = |text: &str| serde_json::Value::from(text).to_string();
    format!(
        "{{\"type\":{},\"title\":{},\"status\":{},\"detail\":{}}}",
        string(&format!("{base}{slug}")),
        string(title),
        status.as_u16(),
        string(detail),
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn json(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes).expect("problem+json")
    }

    #[test]
    fn the_canned_503_declares_its_length() {
        let refusals = Refusals::new(&ListenerOptions::default());
        let response = std::str::from_utf8(refusals.shed()).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(
            head.ends_with(&format!("\r\ncontent-length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
        let problem = json(body.as_bytes());
        assert_eq!(problem["status"], 503);
        assert_eq!(problem["type"], "/problems/connection-limit");
        assert_eq!(problem["title"], "Too many connections");
    }

    #[test]
    fn every_refusal_is_under_the_default_base_unless_one_is_given() {
        let options = ListenerOptions {
            body_read_timeout: Duration::from_millis(1_500),
            ..ListenerOptions::default()
        };
        let refusals = Refusals::new(&options);
        let timeout = json(&refusals.body_timeout);
        assert_eq!(timeout["type"], "/problems/body-timeout");
        assert_eq!(timeout["status"], 408);
        assert_eq!(timeout["title"], "Request body too slow");
        assert_eq!(
            timeout["detail"],
            "the request body did not arrive within 1500 ms; nothing was done"
        );

        let base = "https://docs.example.com/errors/\"quoted\"/";
        let refusals = Refusals::new(&options.with_problem_type_base(base));
        let shed = std::str::from_utf8(refusals.shed()).unwrap();
        let (_, body) = shed.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            json(body.as_bytes())["type"],
            format!("{base}connection-limit")
        );
        assert_eq!(
            json(&refusals.connection_limit)["type"],
            format!("{base}connection-limit")
        );
        assert_eq!(
            json(&refusals.body_timeout)["type"],
            format!("{base}body-timeout")
        );
    }

    #[test]
    fn the_responses_are_problems_that_close_their_connection() {
        let refusals = Refusals::new(&ListenerOptions::default());
        let evicted = refusals.connection_limit();
        assert_eq!(evicted.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(evicted.headers()[header::RETRY_AFTER], "1");
        let timeout = refusals.body_timeout();
        assert_eq!(timeout.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(timeout.headers().get(header::RETRY_AFTER).is_none());
        for response in [evicted, timeout] {
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "application/problem+json"
            );
            assert_eq!(response.headers()[header::CONNECTION], "close");
        }
    }
}
