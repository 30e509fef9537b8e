//! Streamed answers (PROTOCOL §20): an event stream read event by event as it
//! arrives and, when the connection drops mid-stream, asked for again with the
//! same key and the `Last-Event-ID` of the last event received — each event
//! handed to the caller once, in order.
//!
//! The server answers such a retry from the operation's one stream: joined
//! while it is produced, or replayed once it is stored, starting just after
//! the first block whose id is the `Last-Event-ID` (the whole stream when no
//! id was received). Both ends read the format the same way
//! ([`idemgate_core::event_stream`]), so the client knows the offset the
//! answer starts at and passes over what it already handed on.

use std::collections::{HashMap, VecDeque};

use http::HeaderValue;
use idemgate_core::event_stream::{EventBlock, EventStreamReader, LAST_EVENT_ID};
use reqwest_middleware::ClientWithMiddleware;

use crate::Error;
use crate::answer::is_replayed;
use crate::attempt::{Answer, AnswerError, answer};
use crate::policy::Attempts;

/// One event of a stream, as a browser's `EventSource` dispatches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    event: Option<String>,
    data: String,
    last_event_id: Option<String>,
}

impl Event {
    /// Its type: the `event` field, `message` without one (or with an empty
    /// one, as the HTML standard dispatches it).
    pub fn kind(&self) -> &str {
        self.event
            .as_deref()
            .filter(|kind| !kind.is_empty())
            .unwrap_or("message")
    }

    /// Its data: the `data` lines joined with LF.
    pub fn data(&self) -> &str {
        &self.data
    }

    /// The stream's last event id when it arrived (its own `id`, or the one
    /// an earlier event set); `None` when none was set.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }
}

/// A streamed answer, read with [`next`](Self::next); made by
/// [`RequestBuilder::send_events`](crate::RequestBuilder::send_events).
#[derive(Debug)]
pub struct Events {
    http: ClientWithMiddleware,
    attempts: Attempts,
    /// The request, kept for the attempts that resume the stream.
    request: Option<reqwest::Request>,
    response: reqwest::Response,
    replayed: bool,
    reader: EventStreamReader,
    ready: VecDeque<Event>,
    /// The stream offset just after the last block handed on or passed over.
    read_to: u64,
    /// The stream's last event id so far.
    last_event_id: Option<String>,
    /// Where the first block with each id ended: a stream resumed after an id
    /// starts there.
    first_end_of: HashMap<String, u64>,
    ended: bool,
}

impl Events {
    pub(crate) fn new(
        http: ClientWithMiddleware,
        attempts: Attempts,
        request: Option<reqwest::Request>,
        response: reqwest::Response,
    ) -> Self {
        Self {
            http,
            attempts,
            request,
            replayed: is_replayed(response.headers()),
            response,
            reader: EventStreamReader::default(),
            ready: VecDeque::new(),
            read_to: 0,
            last_event_id: None,
            first_end_of: HashMap::new(),
            ended: false,
        }
    }

    /// The answer's status.
    pub fn status(&self) -> http::StatusCode {
        self.response.status()
    }

    /// Whether the first answer was the operation's stream replayed or joined
    /// rather than produced for this request (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// Attempts made so far, the ones that resumed the stream included.
    pub fn attempts(&self) -> u32 {
        self.attempts.made()
    }

    /// The next event; `None` once the stream ended cleanly. A dropped
    /// connection is resumed under the request's [`RetryPolicy`](crate::RetryPolicy)
    /// (its retries and deadline count every attempt); when it cannot be,
    /// the error says why, and the events handed on so far stay the
    /// operation's first ones.
    pub async fn next(&mut self) -> Option<Result<Event, Error>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            if self.ended {
                return None;
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => {
                    let blocks = self.reader.feed(&bytes);
                    self.take(blocks);
                }
                Ok(None) => {
                    let last = self.reader.finish();
                    self.take(last);
                    self.ended = true;
                }
                Err(cut) => {
                    if let Err(error) = self.resume(cut.into()).await {
                        self.ended = true;
                        return Some(Err(error));
                    }
                }
            }
        }
    }

    /// Hands on the blocks past what was read before, as events.
    fn take(&mut self, blocks: impl IntoIterator<Item = EventBlock>) {
        for block in blocks {
            if block.end <= self.read_to {
                continue; // handed on before the connection dropped
            }
            self.read_to = block.end;
            if let Some(id) = block.id {
                self.first_end_of.entry(id.clone()).or_insert(block.end);
                self.last_event_id = (!id.is_empty()).then_some(id);
            }
            if let Some(data) = block.data {
                self.ready.push_back(Event {
                    event: block.event,
                    data,
                    last_event_id: self.last_event_id.clone(),
                });
            }
        }
    }

    /// After the stream broke off with `cut`: the attempts that ask for it
    /// again, until one answers with the operation's stream.
    async fn resume(&mut self, cut: reqwest_middleware::Error) -> Result<(), Error> {
        let mut failure = cut;
        loop {
            if !self.attempts.again_after_error(&failure).await {
                return Err(Error::Transport {
                    source: failure,
                    may_have_run: self.attempts.may_have_run(),
                });
            }
            // An id a header cannot carry as it is (not visible ASCII, or with
            // spaces at an end, which HTTP trims): the whole stream instead, as
            // the server would answer an id it does not find.
            let header = self
                .last_event_id
                .as_deref()
                .filter(|id| !id.starts_with([' ', '\t']) && !id.ends_with([' ', '\t']))
                .and_then(|id| Some((HeaderValue::from_str(id).ok()?, self.first_end_of[id])));
            let (header, starts_at) = match header {
                Some((value, starts_at)) => (Some(value), starts_at),
                None => (None, 0),
            };
            if let Some(request) = self.request.as_mut() {
                let headers = request.headers_mut();
                match header {
                    Some(value) => headers.insert(LAST_EVENT_ID, value),
                    None => headers.remove(LAST_EVENT_ID),
                };
            }
            let attempt = self.attempts.next(&mut self.request);
            match answer(&self.http, attempt, &mut self.attempts).await {
                Ok(Answer::Streaming(response)) if is_replayed(response.headers()) => {
                    self.response = response;
                    self.reader = EventStreamReader::starting_at(starts_at);
                    return Ok(());
                }
                // The operation ran again: its first run, whose events were
                // handed on, was not kept (a cut stream released, §20).
                Ok(Answer::Streaming(_)) => return Err(Error::StreamRestarted),
                Ok(Answer::Again) => {}
                Err(AnswerError::Final(error)) => return Err(error),
                Err(AnswerError::Transport(error)) => failure = error,
            }
        }
    }
}
