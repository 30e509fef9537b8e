//! Streams in flight on this process, for retries to join (PROTOCOL §20).
//!
//! A streamed answer ([`crate::execution`]) is registered here under its
//! record's identity while it flows, with every frame it has sent so far. A
//! retry of the same operation that finds its record in flight joins it here
//! instead of waiting or getting 409: it receives the stream from its first
//! byte (or after its `Last-Event-ID`), then live, and ends as the first
//! client's stream ends — cleanly once the record is written, cut when it is
//! cut. The frames are the ones the record keeps (shared, not copied), so a
//! joined stream costs no memory of its own; a stream past the stored-response
//! limit keeps nothing and can no longer be joined from its first byte: its
//! joiners are cut, and later retries wait for its outcome as for any other.
//!
//! Only this process's streams: a retry that reaches another instance waits
//! for the outcome there (the record in pieces in the store is to come).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::StreamBody;
use tokio::sync::Notify;

use idemgate_core::BoxError;
use idemgate_core::event_stream::resume_offset;
use idemgate_core::record::OperationId;
use idemgate_core::scope::IdentityDigest;

use crate::response::{IDEMPOTENT_REPLAYED, ReplayRequest};
use crate::telemetry::count_stream;

/// This process's streams in flight, by record identity. Shared by the
/// layer's clones.
#[derive(Default)]
pub(crate) struct LiveStreams {
    streams: Mutex<HashMap<IdentityDigest, Arc<LiveStream>>>,
}

/// One stream in flight: its head, and its frames so far.
pub(crate) struct LiveStream {
    /// The run the stream is; a retry joins only the run its record names.
    operation_id: OperationId,
    status: StatusCode,
    /// The head's storable headers: what a replay of it would send.
    headers: Vec<(HeaderName, HeaderValue)>,
    progress: Mutex<Progress>,
    changed: Notify,
}

struct Progress {
    /// Every frame so far; `None` once past the limit.
    frames: Option<Vec<Bytes>>,
    end: Option<End>,
}

/// How a stream in flight ended, for those who joined it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Its record was written: a clean end.
    Recorded,
    /// It broke off, was fenced, outgrew the limit, or its run ended without
    /// settling it: the joiners' streams are cut.
    Cut,
}

impl LiveStreams {
    /// Registers the stream of run `operation_id` of `identity`; it stays
    /// joinable until the returned guard ends it (or drops: a cut).
    pub(crate) fn register(
        self: &Arc<Self>,
        identity: IdentityDigest,
        operation_id: OperationId,
        status: StatusCode,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Registered {
        let stream = Arc::new(LiveStream {
            operation_id,
            status,
            headers,
            progress: Mutex::new(Progress {
                frames: Some(Vec::new()),
                end: None,
            }),
            changed: Notify::new(),
        });
        self.lock().insert(identity, Arc::clone(&stream));
        Registered {
            streams: Arc::clone(self),
            identity,
            stream,
            ended: false,
        }
    }

    /// The joined stream of run `operation_id` of `identity`, when it is in
    /// flight here and still holds its first byte.
    pub(crate) fn join(
        &self,
        identity: &IdentityDigest,
        operation_id: OperationId,
        wants: &ReplayRequest,
    ) -> Option<Response<Body>> {
        let stream = self.lock().get(identity).cloned()?;
        if stream.operation_id != operation_id {
            return None;
        }
        let start = {
            let progress = stream
                .progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let frames = progress.frames.as_ref()?;
            match wants.last_event_id() {
                Some(last_event_id) => {
                    let so_far: Vec<u8> = frames.concat();
                    resume_offset(&so_far, last_event_id).unwrap_or(0)
                }
                None => 0,
            }
        };
        count_stream("joined");
        let body = futures_util::stream::unfold(
            Joined {
                stream: Arc::clone(&stream),
                next: 0,
                skip: start,
                cut_sent: false,
            },
            Joined::next,
        );
        let mut response = Response::new(Body::new(StreamBody::new(body)));
        *response.status_mut() = stream.status;
        let headers = response.headers_mut();
        for (name, value) in &stream.headers {
            headers.append(name.clone(), value.clone());
        }
        headers.insert(
            IDEMPOTENT_REPLAYED.clone(),
            HeaderValue::from_static("true"),
        );
        Some(response)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IdentityDigest, Arc<LiveStream>>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A registered stream, as its run holds it.
pub(crate) struct Registered {
    streams: Arc<LiveStreams>,
    identity: IdentityDigest,
    stream: Arc<LiveStream>,
    ended: bool,
}

impl Registered {
    /// One more frame, for the joiners; past the limit (`kept` false) the
    /// stream can no longer be joined and its joiners are cut.
    pub(crate) fn push(&mut self, data: &Bytes, kept: bool) {
        if !kept {
            self.end(End::Cut);
            return;
        }
        let mut progress = self
            .stream
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(frames) = &mut progress.frames {
            frames.push(data.clone());
        }
        drop(progress);
        self.stream.changed.notify_waiters();
    }

    /// Ends the stream for its joiners, and takes it off the register.
    pub(crate) fn end(&mut self, end: End) {
        if self.ended {
            return;
        }
        self.ended = true;
        {
            let mut streams = self.streams.lock();
            if streams
                .get(&self.identity)
                .is_some_and(|s| Arc::ptr_eq(s, &self.stream))
            {
                streams.remove(&self.identity);
            }
        }
        let mut progress = self
            .stream
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        progress.end = Some(end);
        if end == End::Cut {
            progress.frames = None;
        }
        drop(progress);
        self.stream.changed.notify_waiters();
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.end(End::Cut);
    }
}

/// A joiner's position in a stream.
struct Joined {
    stream: Arc<LiveStream>,
    /// The next frame to send.
    next: usize,
    /// Bytes still to skip (a `Last-Event-ID` resumption).
    skip: usize,
    cut_sent: bool,
}

type Frame = Result<http_body::Frame<Bytes>, BoxError>;

impl Joined {
    async fn next(mut self) -> Option<(Frame, Self)> {
        loop {
            // Registered before the look, so a change between the two wakes it.
            let stream = Arc::clone(&self.stream);
            let changed = stream.changed.notified();
            let step = {
                let progress = self
                    .stream
                    .progress
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match (&progress.frames, progress.end) {
                    (_, Some(End::Cut)) | (None, _) => Step::Cut,
                    (Some(frames), _) if self.next < frames.len() => {
                        Step::Send(frames[self.next].clone())
                    }
                    (Some(_), Some(End::Recorded)) => Step::End,
                    (Some(_), None) => Step::Wait,
                }
            };
            match step {
                Step::Send(mut data) => {
                    self.next += 1;
                    if self.skip >= data.len() {
                        self.skip -= data.len();
                        continue;
                    }
                    data = data.slice(self.skip..);
                    self.skip = 0;
                    return Some((Ok(http_body::Frame::data(data)), self));
                }
                Step::End => return None,
                Step::Cut if self.cut_sent => return None,
                Step::Cut => {
                    // One error (the client's connection is cut), then nothing.
                    self.cut_sent = true;
                    let cut: BoxError = "the stream this retry joined broke off".into();
                    return Some((Err(cut), self));
                }
                Step::Wait => changed.await,
            }
        }
    }
}

enum Step {
    Send(Bytes),
    End,
    Cut,
    Wait,
}
