//! Typed outcomes: what went wrong, and whether the operation may have run.

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use idemgate_core::wire::{IN_PROGRESS, KEY_REUSED, is_problem};
use serde::Deserialize;

/// An `application/problem+json` answer (RFC 9457), as the server sent it.
///
/// An answer that is not problem+json (a plain-text 502 from a load balancer) is
/// read as RFC 9457 says: type `about:blank`, the status's reason as the title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The problem type URI (`/problems/…` for idemgate's own under the default base).
    pub type_uri: String,
    /// Short, the same for every occurrence of the type.
    pub title: Option<String>,
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// What happened this time.
    pub detail: Option<String>,
}

impl Problem {
    /// Reads the problem from an answer's parts.
    pub(crate) fn read(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Self {
        #[derive(Deserialize)]
        struct Body {
            #[serde(rename = "type")]
            type_uri: Option<String>,
            title: Option<String>,
            detail: Option<String>,
        }
        let is_problem = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/problem+json"));
        let body = is_problem
            .then(|| serde_json::from_slice::<Body>(body).ok())
            .flatten();
        let (type_uri, title, detail) = match body {
            Some(b) => (b.type_uri, b.title, b.detail),
            None => (None, None, None),
        };
        Self {
            type_uri: type_uri.unwrap_or_else(|| "about:blank".to_owned()),
            title: title.or_else(|| status.canonical_reason().map(str::to_owned)),
            status,
            detail,
        }
    }

    /// Whether this is idemgate's problem with this slug (`key-reused`, …): the
    /// type URI decides, never the wording of the title or detail.
    pub fn is_idemgate(&self, slug: &str) -> bool {
        is_problem(&self.type_uri, slug)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.type_uri)?;
        if let Some(title) = &self.title {
            write!(f, " ({title})")?;
        }
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

/// Why an operation did not end in a `2xx`/`3xx` [`Response`](crate::Response).
///
/// Each says, through [`Error::may_have_run`], whether the operation may have taken
/// effect on the server — the question an application must answer before telling
/// its user "not paid".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `422` `key-reused`: the key was used before for a *different* request
    /// (another body, path or method). This request did not run. A bug in the
    /// caller, usually: one key per action, and the action's body fixed once made.
    #[error("the Idempotency-Key was already used for a different request: {problem}")]
    KeyReused {
        /// The server's answer.
        problem: Problem,
    },
    /// `409` `in-progress` after the retries ran out: the first attempt is still
    /// running on the server. It may well succeed; ask again later with the same
    /// [`Operation`](crate::Operation) to get its outcome.
    #[error("the operation is still running on the server: {problem}")]
    StillInProgress {
        /// The server's last `Retry-After`.
        retry_after: Option<Duration>,
        /// The server's answer.
        problem: Problem,
    },
    /// Any other `4xx`/`5xx` that is the outcome: a refused request, a replayed
    /// failure, or a `5xx` the retries did not get past.
    #[error("the server answered {problem}")]
    Rejected {
        /// The server's answer.
        problem: Problem,
        /// It was a replay: the stored outcome of this operation.
        replayed: bool,
        /// See [`Error::may_have_run`].
        may_have_run: bool,
    },
    /// No answer: every attempt failed in transport, or the deadline cut the last.
    #[error("no answer from the server")]
    Transport {
        /// The last attempt's failure.
        #[source]
        source: reqwest_middleware::Error,
        /// See [`Error::may_have_run`].
        may_have_run: bool,
    },
    /// A streamed answer broke off, and the retry that asked for it again was
    /// answered by a new run of the operation, not the first one's stream: the
    /// server did not keep that run (a cut stream is released by the route's
    /// server-error policy). The events handed on so far were that run's; the
    /// new run is now the operation's outcome — ask for it with the same
    /// [`Operation`](crate::Operation) to read its stream whole.
    #[error(
        "the stream broke off and the server ran the operation again rather than resume it: the events so far were a run it did not keep"
    )]
    StreamRestarted,
    /// The request body is a stream, which cannot be sent again on a retry.
    /// Nothing was sent. Buffer it (`Vec<u8>`, `Bytes`, `String`, `.json(..)`).
    #[error(
        "the request body is a stream and cannot be replayed on a retry; nothing was sent: buffer the body"
    )]
    BodyNotReplayable,
    /// The request could not be built (a bad URL or header). Nothing was sent.
    #[error("the request could not be built")]
    Build(#[source] reqwest::Error),
}

impl Error {
    /// Whether the operation may have taken effect on the server.
    ///
    /// `false` only when no attempt can have run it: nothing was sent, or every
    /// answer was a refusal made before running (`422`, `4xx`). `true` for a
    /// request still in progress, for `5xx` outcomes, and whenever an attempt was
    /// sent and its answer lost. When it is `true`, retry later with the same
    /// [`Operation`](crate::Operation) to learn the outcome — never with a new one.
    pub fn may_have_run(&self) -> bool {
        match self {
            Self::StillInProgress { .. } | Self::StreamRestarted => true,
            Self::Rejected { may_have_run, .. } | Self::Transport { may_have_run, .. } => {
                *may_have_run
            }
            Self::KeyReused { .. } | Self::BodyNotReplayable | Self::Build(_) => false,
        }
    }

    /// The server's problem+json, for the errors that are answers.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::KeyReused { problem }
            | Self::StillInProgress { problem, .. }
            | Self::Rejected { problem, .. } => Some(problem),
            _ => None,
        }
    }

    /// The error for a final, unsuccessful answer.
    pub(crate) fn from_answer(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        may_have_run: bool,
    ) -> Self {
        let problem = Problem::read(status, headers, body);
        let retry_after = crate::answer::retry_after(headers);
        if status == StatusCode::UNPROCESSABLE_ENTITY && problem.is_idemgate(KEY_REUSED) {
            Self::KeyReused { problem }
        } else if status == StatusCode::CONFLICT
            && (problem.is_idemgate(IN_PROGRESS) || retry_after.is_some())
        {
            Self::StillInProgress {
                retry_after,
                problem,
            }
        } else {
            Self::Rejected {
                replayed: crate::answer::is_replayed(headers),
                may_have_run: may_have_run || status.is_server_error(),
                problem,
            }
        }
    }
}
