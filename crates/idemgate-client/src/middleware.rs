//! The same retries as a `reqwest-middleware` middleware.

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use crate::RetryPolicy;
use crate::policy::Attempts;

/// Retries by [`RetryPolicy`] inside a `reqwest_middleware` chain, for
/// applications that keep their own `ClientWithMiddleware` and set the
/// `Idempotency-Key` header themselves.
///
/// The rules are those of [`Client`](crate::Client): a request without an
/// `Idempotency-Key` header and with a non-idempotent method passes through with
/// one attempt; a retryable request with a stream body is refused before it is
/// sent (`Error::Middleware` holding [`Error::BodyNotReplayable`](crate::Error)).
/// Unlike [`Client`](crate::Client) it judges an attempt by its status and
/// headers, before the body is read (a middleware hands the body on unread), and
/// answers with the last response rather than a typed error.
///
/// Put it before (outside) the middlewares that should run on every attempt:
///
/// ```
/// use idemgate_client::{RetryMiddleware, RetryPolicy};
///
/// let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(RetryPolicy::default()))
///     // .with(TracingMiddleware::default()) — once per attempt
///     .build();
/// ```
#[derive(Debug, Clone, Default)]
pub struct RetryMiddleware {
    policy: RetryPolicy,
}

impl RetryMiddleware {
    /// A middleware retrying by `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut attempts = Attempts::start(&self.policy, &request)
            .map_err(reqwest_middleware::Error::middleware)?;
        let mut pending = Some(request);
        loop {
            let attempt = attempts.next(&mut pending);
            let outcome = next.clone().run(attempt, extensions).await;
            let again = match &outcome {
                Ok(response) => {
                    attempts
                        .again_after_response(response.status(), response.headers())
                        .await
                }
                Err(error) => attempts.again_after_error(error).await,
            };
            if !again {
                return outcome;
            }
        }
    }
}
