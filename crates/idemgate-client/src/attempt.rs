//! One attempt of a request whose answer's body the caller reads itself (a
//! streamed answer): send it, read the head, and judge an unsuccessful answer
//! by the [`RetryPolicy`](crate::RetryPolicy)'s rules. Shared by the first
//! attempts ([`RequestBuilder::send_events`](crate::RequestBuilder::send_events))
//! and the ones that resume a stream ([`Events`](crate::Events)).

use reqwest_middleware::ClientWithMiddleware;

use crate::Error;
use crate::policy::Attempts;

/// What one attempt's answer asks for.
pub(crate) enum Answer {
    /// A `2xx`/`3xx` whose body is still to be read.
    Streaming(reqwest::Response),
    /// Another attempt, already waited for.
    Again,
}

/// Why an attempt ends the request.
pub(crate) enum AnswerError {
    /// The outcome: a final unsuccessful answer.
    Final(Error),
    /// No answer; the attempts decide whether another is due.
    Transport(reqwest_middleware::Error),
}

/// Sends one attempt and reads its answer's head: a successful answer's body is
/// left to the caller; an unsuccessful one is read and judged, and waited
/// for when another attempt is due.
pub(crate) async fn answer(
    http: &ClientWithMiddleware,
    attempt: reqwest::Request,
    attempts: &mut Attempts,
) -> Result<Answer, AnswerError> {
    let response = http
        .execute(attempt)
        .await
        .map_err(AnswerError::Transport)?;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        // A final answer: counted (it may have run), never waited for.
        attempts
            .again_after_response(status, response.headers())
            .await;
        return Ok(Answer::Streaming(response));
    }
    let headers = response.headers().clone();
    let body = response
        .bytes()
        .await
        .map_err(|cut| AnswerError::Transport(cut.into()))?;
    if attempts.again_after_response(status, &headers).await {
        return Ok(Answer::Again);
    }
    let may_have_run = attempts.may_have_run();
    Err(AnswerError::Final(Error::from_answer(
        status,
        &headers,
        &body,
        may_have_run,
    )))
}
