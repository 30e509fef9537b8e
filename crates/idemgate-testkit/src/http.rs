//! A response read whole, as HTTP tests check it: [`Answer`] (feature `http`).
//!
//! It is made of `http` types only (a [`StatusCode`], a [`HeaderMap`], the body's
//! [`Bytes`]), and [`Answer::read`] takes an [`http::Response`] with any body, so one
//! type serves every way a test gets a response: an axum `Router` driven with
//! `oneshot`, a hyper client, or `reqwest` (`http::Response::from(response)`).
//! Nothing here depends on the layer or on axum, so the layer's own tests use it
//! without a dependency cycle.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use idemgate_testkit::Answer;
//!
//! let response = http::Response::builder()
//!     .status(201)
//!     .header("idempotent-replayed", "true")
//!     .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{\"order\":7}")))
//!     .unwrap();
//! let answer = Answer::read(response).await;
//! assert!(answer.replayed());
//! assert_eq!(answer.json()["order"], 7);
//! # });
//! ```

use std::fmt;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;

/// The media type of a problem answer (RFC 9457), which every idemgate error is.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A response, read whole: its status, its headers (in order, repeats kept) and
/// every byte of its body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers, as the response had them.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// Reads `response` whole. Panics if its body fails: a test that expects a
    /// body failure uses [`Answer::try_read`].
    pub async fn read<B>(response: Response<B>) -> Self
    where
        B: Body,
        B::Error: fmt::Debug,
    {
        Self::try_read(response)
            .await
            .unwrap_or_else(|err| panic!("the response body failed: {err:?}"))
    }

    /// Reads `response` whole, or returns the error its body failed with (a
    /// connection cut mid-body, a client's timeout).
    pub async fn try_read<B: Body>(response: Response<B>) -> Result<Self, B::Error> {
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Self {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Whether the layer marked this answer as a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true")
    }

    /// The `Content-Type`, if there is one and it is text.
    pub fn content_type(&self) -> Option<&str> {
        self.headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
    }

    /// The body as text. Panics if it is not UTF-8.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body)
            .unwrap_or_else(|_| panic!("the body is not UTF-8: {:?}", self.body))
    }

    /// The body as JSON. Panics if it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("the body is not JSON: {:?}", self.body))
    }

    /// The RFC 9457 `type` of a problem answer. Panics unless the answer is
    /// `application/problem+json` with a string `type`.
    pub fn problem_type(&self) -> String {
        assert_eq!(self.content_type(), Some(PROBLEM_JSON), "{self:?}");
        self.json()["type"]
            .as_str()
            .unwrap_or_else(|| panic!("a problem without a type: {self:?}"))
            .to_owned()
    }
}
