//! The client: operations over a `reqwest` (middleware) client, retried by the
//! [`RetryPolicy`], ending in a [`Response`] or an [`Error`].

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use idemgate_core::key::IDEMPOTENCY_KEY;
use reqwest::IntoUrl;
use reqwest_middleware::ClientWithMiddleware;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::answer::is_replayed;
use crate::attempt::{Answer, AnswerError, answer};
use crate::events::Events;
use crate::policy::Attempts;
use crate::{Error, Operation, RetryPolicy};

/// Sends requests, retrying the ones it safely can (see [`RetryPolicy`]).
///
/// Built over a `reqwest::Client` or a `reqwest_middleware::ClientWithMiddleware`,
/// so tracing and auth middlewares run on every attempt. Cheap to clone; make one
/// and share it.
#[derive(Debug, Clone)]
pub struct Client {
    http: ClientWithMiddleware,
    policy: RetryPolicy,
}

impl Client {
    /// A client over `http`, with the default [`RetryPolicy`].
    ///
    /// ```
    /// let client = idemgate_client::Client::new(reqwest::Client::new());
    /// ```
    pub fn new(http: impl Into<ClientWithMiddleware>) -> Self {
        Self {
            http: http.into(),
            policy: RetryPolicy::default(),
        }
    }

    /// The same client with another policy.
    ///
    /// ```
    /// use idemgate_client::{Client, RetryPolicy};
    /// let client = Client::new(reqwest::Client::new()).with_policy(RetryPolicy::default().max_retries(2));
    /// ```
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A `POST` to `url`.
    pub fn post(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// A `PATCH` to `url`.
    pub fn patch(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// A `GET` of `url` (idempotent, so retried without a key).
    pub fn get(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// A request with any method.
    pub fn request(&self, method: Method, url: impl IntoUrl) -> RequestBuilder {
        RequestBuilder {
            inner: self.http.request(method, url),
            policy: self.policy.clone(),
            operation: None,
        }
    }
}

/// A request being built; [`send`](Self::send) runs it.
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder {
    inner: reqwest_middleware::RequestBuilder,
    policy: RetryPolicy,
    operation: Option<Operation>,
}

impl RequestBuilder {
    /// Sends this request as an attempt of `operation`: with its key, and retried.
    pub fn operation(mut self, operation: &Operation) -> Self {
        self.operation = Some(operation.clone());
        self
    }

    /// Adds a header.
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.inner = self.inner.header(name, value);
        self
    }

    /// `Authorization: Bearer <token>`.
    pub fn bearer_auth(mut self, token: impl std::fmt::Display) -> Self {
        self.inner = self.inner.bearer_auth(token);
        self
    }

    /// A JSON body (and `Content-Type: application/json`), serialized once: every
    /// attempt sends the same bytes.
    pub fn json<T: Serialize + ?Sized>(mut self, body: &T) -> Self {
        self.inner = self.inner.json(body);
        self
    }

    /// A body. It must be bytes, not a stream, for a request that may be retried.
    pub fn body(mut self, body: impl Into<reqwest::Body>) -> Self {
        self.inner = self.inner.body(body);
        self
    }

    /// The policy for this request only.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sends the attempts until one answers, and returns its body as an event
    /// stream (`text/event-stream`) to read as it arrives: [`Events::next`]
    /// hands on each event once, in order, and resumes a stream whose
    /// connection dropped — with the operation's key and the `Last-Event-ID`
    /// of the last event received — under this request's policy.
    ///
    /// Without an [`Operation`] (and for a method that is not idempotent) a
    /// dropped stream is not asked for again: the error says so.
    ///
    /// ```no_run
    /// use idemgate_client::{Client, Operation};
    ///
    /// # async fn chat() -> Result<(), idemgate_client::Error> {
    /// let client = Client::new(reqwest::Client::new());
    /// let ask = Operation::new();
    /// let mut events = client.post("http://127.0.0.1:8080/v1/chat/completions")
    ///     .json(&serde_json::json!({"stream": true, "messages": []})).operation(&ask)
    ///     .send_events().await?;
    /// while let Some(event) = events.next().await {
    ///     print!("{}", event?.data());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn send_events(self) -> Result<Events, Error> {
        let (http, mut attempts, mut pending) = self.start()?;
        loop {
            let attempt = attempts.next(&mut pending);
            match answer(&http, attempt, &mut attempts).await {
                Ok(Answer::Streaming(response)) => {
                    return Ok(Events::new(http, attempts, pending, response));
                }
                Ok(Answer::Again) => {}
                Err(AnswerError::Final(error)) => return Err(error),
                Err(AnswerError::Transport(error)) => {
                    if !attempts.again_after_error(&error).await {
                        return Err(Error::Transport {
                            source: error,
                            may_have_run: attempts.may_have_run(),
                        });
                    }
                }
            }
        }
    }

    /// The request built, with the operation's key, and its attempts begun:
    /// what `send` and `send_events` send.
    fn start(self) -> Result<(ClientWithMiddleware, Attempts, Option<reqwest::Request>), Error> {
        let (http, request) = self.inner.build_split();
        let mut request = request.map_err(Error::Build)?;
        if let Some(operation) = &self.operation {
            request
                .headers_mut()
                .insert(IDEMPOTENCY_KEY.clone(), operation.header_value());
        }
        let attempts = Attempts::start(&self.policy, &request)?;
        Ok((http, attempts, Some(request)))
    }

    /// Sends the attempts and returns the outcome.
    ///
    /// Each attempt reads the whole response body, so a response cut off halfway
    /// is retried like any lost response.
    pub async fn send(self) -> Result<Response, Error> {
        let (http, mut attempts, mut pending) = self.start()?;
        loop {
            let attempt = attempts.next(&mut pending);
            match read(http.execute(attempt).await).await {
                Ok((status, headers, body)) => {
                    if attempts.again_after_response(status, &headers).await {
                        continue;
                    }
                    if status.is_client_error() || status.is_server_error() {
                        let may_have_run = attempts.may_have_run();
                        return Err(Error::from_answer(status, &headers, &body, may_have_run));
                    }
                    return Ok(Response {
                        status,
                        headers,
                        body,
                        attempts: attempts.made(),
                    });
                }
                Err(error) => {
                    if attempts.again_after_error(&error).await {
                        continue;
                    }
                    return Err(Error::Transport {
                        source: error,
                        may_have_run: attempts.may_have_run(),
                    });
                }
            }
        }
    }
}

async fn read(
    sent: reqwest_middleware::Result<reqwest::Response>,
) -> reqwest_middleware::Result<(StatusCode, HeaderMap, Bytes)> {
    let response = sent?;
    let (status, headers) = (response.status(), response.headers().clone());
    let body = response.bytes().await?;
    Ok((status, headers, body))
}

/// The successful (`2xx`/`3xx`) outcome of an operation, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    attempts: u32,
}

impl Response {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body bytes.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.body)
    }

    /// Whether the server replayed a stored outcome (`Idempotent-Replayed: true`)
    /// rather than running the operation for this attempt: true after a lost
    /// response was retried, or after a wait on a running duplicate.
    pub fn replayed(&self) -> bool {
        is_replayed(&self.headers)
    }

    /// How many attempts it took (1 when the first was answered).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}
