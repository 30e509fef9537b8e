//! Streams read back from the store (PROTOCOL §20): a retry joining a run
//! whose stream is still flowing, and the replay of a completed one.
//!
//! Both read the run's pieces ([`crate::recording`] wrote them) a batch at a
//! time, so a reader holds at most [`BATCH`] pieces, whatever the stream's
//! size. A joined stream reads live: when it has read every piece appended so
//! far it looks at the record — still in progress under a live lease: it waits
//! for the store's next change announcement (an appended piece, the run's
//! end; on any instance sharing the store); completed with its pieces: it
//! reads to the last and ends cleanly; anything else (a cut stream settled as
//! a failure, a released or vanished record, a stream not retained, a lapsed
//! lease): it is cut, never ended cleanly.
//!
//! A retry that sent `Last-Event-ID` gets the event stream from just after
//! the first event with that id ([`EventStreamReader`], the reading clients
//! resume by too); when no event has it, the whole stream once the stream has
//! ended — a duplicate rather than a gap.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::StreamBody;
use idemgate_core::event_stream::EventStreamReader;
use idemgate_core::record::{RecordState, StoredBody, StoredResponse};
use idemgate_core::stream::{HEAD_PIECE, StreamId, decode_head};
use idemgate_core::{BoxError, Store, StoreError};

use crate::response::{IDEMPOTENT_REPLAYED, ReplayRequest, is_event_stream, replay};
use crate::telemetry::count_stream;

/// How many pieces a reader asks for at once.
const BATCH: u32 = 16;

/// How long a joined stream waits for a change announcement before it looks
/// again anyway (an announcement is a hint and may be missed).
const RECHECK: Duration = Duration::from_millis(200);

/// The pause before a failed read of pieces is tried again.
const READ_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The stream of a run in flight, joined: its head, then its pieces, live.
/// `None` when the run has recorded no head (its answer is no stream, or has
/// not begun), stopped recording (past the limit), or its head cannot be
/// read: the retry waits for the outcome as for any run in flight.
pub(crate) async fn join(
    store: Arc<dyn Store>,
    stream: StreamId,
    wants: &ReplayRequest,
) -> Option<Response<Body>> {
    // An empty head: the recording stopped (`crate::recording::abandon`),
    // so the stream cannot be joined from its first byte.
    let head = match store.read_stream_pieces(&stream, HEAD_PIECE, 1).await {
        Ok(mut pieces) => pieces.pop().filter(|head| !head.is_empty())?,
        Err(error) => {
            // The retry waits for the outcome instead, as for any run.
            tracing::warn!(%error, "reading a stream's head to join it failed");
            return None;
        }
    };
    let (status, headers) = match decode_head(head) {
        Ok(head) => head,
        Err(error) => {
            tracing::error!(%error, "a stream's recorded head does not decode");
            return None;
        }
    };
    count_stream("joined");
    let reader = PieceReader::new(store, stream, None, wants, &headers);
    Some(streamed(status, &headers, reader))
}

/// The replay of a completed stream of `count` pieces: its stored head, then
/// its pieces, read as they are sent. A JSON-RPC retry's answer carries its
/// own `id` (§20), so its body is read whole (it was recorded within the
/// stored-response limit) and rewritten.
pub(crate) async fn replay_pieces(
    store: Arc<dyn Store>,
    stream: StreamId,
    stored: &StoredResponse,
    count: u32,
    wants: &ReplayRequest,
) -> Result<Response<Body>, StoreError> {
    if wants.jsonrpc_id().is_some() {
        let mut body = Vec::new();
        let mut next = HEAD_PIECE + 1;
        while next <= count {
            let pieces = read_more(store.as_ref(), &stream, next, count).await?;
            next += pieces.len() as u32;
            body.extend(pieces.iter().flat_map(|piece| piece.iter()));
        }
        let whole = StoredResponse {
            body: StoredBody::Retained(body.into()),
            ..stored.clone()
        };
        count_stream("replayed");
        return Ok(replay(&whole, wants));
    }
    let mut reader = PieceReader::new(store, stream, Some(count), wants, &stored.headers);
    // The first batch before the head, so that a stream whose pieces are gone
    // is answered with an error, not a 200 cut at once.
    if count > 0 {
        let first = read_more(reader.store.as_ref(), &stream, reader.next, count).await?;
        reader.next += first.len() as u32;
        reader.take(first);
    }
    count_stream("replayed");
    Ok(streamed(stored.status, &stored.headers, reader))
}

/// The next batch of a completed stream of `count` pieces, from `next`: an
/// error when none is there, since the record says they are.
async fn read_more(
    store: &dyn Store,
    stream: &StreamId,
    next: u32,
    count: u32,
) -> Result<Vec<Bytes>, StoreError> {
    let pieces = store
        .read_stream_pieces(stream, next, BATCH.min(count - next + 1))
        .await?;
    if pieces.is_empty() {
        return Err(StoreError::corrupt("a stored stream lacks its pieces"));
    }
    Ok(pieces)
}

/// A response with `status` and `headers`, marked replayed, whose body
/// `reader` reads.
fn streamed(
    status: StatusCode,
    headers: &[(HeaderName, HeaderValue)],
    reader: PieceReader,
) -> Response<Body> {
    let body = futures_util::stream::unfold(reader, PieceReader::next);
    let mut response = Response::new(Body::new(StreamBody::new(body)));
    *response.status_mut() = status;
    let out = response.headers_mut();
    for (name, value) in headers {
        out.append(name.clone(), value.clone());
    }
    out.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    response
}

type Frame = Result<http_body::Frame<Bytes>, BoxError>;

/// A reader's place in a stream.
struct PieceReader {
    store: Arc<dyn Store>,
    stream: StreamId,
    /// The next piece to read.
    next: u32,
    /// The stream's last piece, once known (its record completed).
    last: Option<u32>,
    /// Read and not sent yet.
    ready: VecDeque<Bytes>,
    /// Looking for the event a resuming retry last received.
    seek: Option<Seek>,
    /// Once what was read is sent, the stream is cut for this reason.
    cut_after: Option<&'static str>,
    /// The cut was sent: nothing follows.
    cut: bool,
}

/// A `Last-Event-ID` resumption in progress: the pieces are read, not sent,
/// until the event with the id has ended.
struct Seek {
    last_event_id: String,
    events: EventStreamReader,
    /// The stream offset of the next piece's first byte.
    offset: u64,
}

/// What a reader does next.
enum Step {
    /// Pieces were read.
    Read(Vec<Bytes>),
    /// Every piece was read: the clean end.
    End,
    /// Nothing new yet: wait for the store's next announcement.
    Wait,
    /// The stream is not the operation's outcome after all, or cannot be read.
    Cut(&'static str),
}

impl PieceReader {
    fn new(
        store: Arc<dyn Store>,
        stream: StreamId,
        last: Option<u32>,
        wants: &ReplayRequest,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Self {
        // Only an event stream as a client reads it: not in a content coding.
        let resumable =
            is_event_stream(headers) && !headers.iter().any(|(n, _)| n == header::CONTENT_ENCODING);
        let seek = wants.last_event_id().filter(|_| resumable).map(|id| Seek {
            last_event_id: id.to_owned(),
            events: EventStreamReader::default(),
            offset: 0,
        });
        Self {
            store,
            stream,
            next: HEAD_PIECE + 1,
            last,
            ready: VecDeque::new(),
            seek,
            cut_after: None,
            cut: false,
        }
    }

    async fn next(mut self) -> Option<(Frame, Self)> {
        loop {
            if let Some(data) = self.ready.pop_front() {
                return Some((Ok(http_body::Frame::data(data)), self));
            }
            if self.cut {
                return None;
            }
            let step = match self.cut_after.take() {
                Some(why) => Step::Cut(why),
                None => self.step().await,
            };
            match step {
                Step::Read(pieces) => self.take(pieces),
                Step::End => return None,
                Step::Wait => {
                    self.store
                        .wait_for_change(&self.stream.identity, RECHECK)
                        .await;
                }
                Step::Cut(why) => {
                    // One error (the client's connection is cut), then nothing.
                    self.cut = true;
                    return Some((Err(why.into()), self));
                }
            }
        }
    }

    async fn step(&mut self) -> Step {
        if let Some(last) = self.last
            && self.next > last
        {
            return self.ended();
        }
        let limit = self
            .last
            .map_or(BATCH, |last| BATCH.min(last - self.next + 1));
        let mut read = self
            .store
            .read_stream_pieces(&self.stream, self.next, limit)
            .await;
        if read.is_err() {
            // Once more after a pause: one failed read need not cut a stream.
            tokio::time::sleep(READ_RETRY_PAUSE).await;
            read = self
                .store
                .read_stream_pieces(&self.stream, self.next, limit)
                .await;
        }
        match read {
            Err(error) => {
                tracing::warn!(%error, "reading a stored stream failed; its reader is cut");
                Step::Cut("the stored stream could not be read")
            }
            Ok(mut pieces) if !pieces.is_empty() => {
                self.next += pieces.len() as u32;
                // An empty piece is the recording's mark that it stopped
                // (`crate::recording::abandon`): what came before it is sent,
                // then the cut.
                if let Some(mark) = pieces.iter().position(Bytes::is_empty) {
                    pieces.truncate(mark);
                    self.cut_after = Some("the stream was not retained");
                }
                Step::Read(pieces)
            }
            // Known to have more: its record went away mid-read.
            Ok(_) if self.last.is_some() => Step::Cut("the stored stream is gone"),
            Ok(_) => self.run_state().await,
        }
    }

    /// Every piece so far was read; how the run stands says what comes next.
    async fn run_state(&mut self) -> Step {
        let snapshot = match self.store.get(&self.stream.identity).await {
            Ok(Some(snapshot)) => snapshot,
            Ok(None) => return Step::Cut("the stream's record is gone"),
            Err(error) => {
                tracing::warn!(%error, "reading a streamed run's record failed; its reader is cut");
                return Step::Cut("the stream's record could not be read");
            }
        };
        let record = &snapshot.record;
        if StreamId::of_record(self.stream.identity, record) != self.stream {
            return Step::Cut("the stream's run was taken over");
        }
        match &record.state {
            RecordState::Processing { .. } if record.lease_is_live(snapshot.now) => Step::Wait,
            RecordState::Completed(response) | RecordState::Failed(response) => {
                match response.body {
                    StoredBody::InPieces(last) => {
                        self.last = Some(last);
                        // Pieces may have been appended since the last read.
                        Step::Read(Vec::new())
                    }
                    _ => Step::Cut("the stream was not retained"),
                }
            }
            _ => Step::Cut("the stream broke off"),
        }
    }

    /// Every piece was read. A resumption that never found its event starts
    /// over with the whole stream.
    fn ended(&mut self) -> Step {
        let Some(mut seek) = self.seek.take() else {
            return Step::End;
        };
        if seek
            .events
            .finish()
            .is_some_and(|block| block.id.as_deref() == Some(&seek.last_event_id))
        {
            return Step::End;
        }
        self.next = HEAD_PIECE + 1;
        Step::Read(Vec::new())
    }

    /// Queues `pieces` to send, past the event a resumption looks for.
    fn take(&mut self, pieces: Vec<Bytes>) {
        let mut pieces = pieces.into_iter();
        if let Some(seek) = &mut self.seek {
            for piece in pieces.by_ref() {
                let start = seek.offset;
                seek.offset += piece.len() as u64;
                let found = seek
                    .events
                    .feed(&piece)
                    .into_iter()
                    .find(|block| block.id.as_deref() == Some(&seek.last_event_id));
                if let Some(block) = found {
                    let from =
                        usize::try_from(block.end.saturating_sub(start)).unwrap_or(piece.len());
                    if from < piece.len() {
                        self.ready.push_back(piece.slice(from..));
                    }
                    self.seek = None;
                    break;
                }
            }
        }
        if self.seek.is_none() {
            self.ready.extend(pieces.filter(|piece| !piece.is_empty()));
        }
    }
}
