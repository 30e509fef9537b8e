//! A streamed answer recorded in the store as it flows (PROTOCOL §20,
//! `idemgate_core::stream`).
//!
//! The run hands each frame to a [`Recording`] after sending it to its client;
//! a task of the recording appends the frames to the store in pieces of at
//! most [`PIECE_BUDGET`] bytes, the frames that came while it wrote coalesced
//! into the next piece (so a slow store sees fewer, larger writes and a fast
//! one each event at once, for readers following the stream live). Memory per
//! stream is bounded: at most [`FRAMES_QUEUED`] frames wait for the writer,
//! and past them the run waits for it (the producer is read no faster than the
//! store takes it), plus the batch of at most as many frames being written.
//!
//! A handler that took a transaction (the transactional mode) is the one
//! exception: on SQLite its transaction holds the store's one writer until
//! the run is settled, so no piece could be appended before then. Its stream
//! is kept in memory up to the stored-response limit and stored whole with
//! the completion, in its transaction ([`Recording::in_memory`]); retries wait
//! for its outcome instead of joining it.
//!
//! What it recorded decides the record's body: the count of pieces
//! ([`StoredBody::InPieces`](idemgate_core::record::StoredBody::InPieces)), or
//! nothing — past the stored-response limit, when the store refused the run's
//! pieces (fenced: the run lost its lease) or stayed unavailable — in which
//! case the record completes "not retained" (§7) and is never replayed
//! truncated.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use idemgate_core::stream::{HEAD_PIECE, PIECE_BUDGET};
use idemgate_core::{FencedWrite, Lease, Store, StoreError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How many frames may wait for the writer before the run waits for it.
const FRAMES_QUEUED: usize = 16;

/// How often one piece's append is tried against an unavailable store: the
/// run's producer waits meanwhile (each try is bounded by the store's
/// deadline), so once more, then the stream goes on unrecorded.
const APPEND_ATTEMPTS: u32 = 2;

/// The pause between two attempts of one append.
const APPEND_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// One stream's recording in progress.
pub(crate) enum Recording {
    /// Appended to the store as it flows, by a writer task.
    InStore {
        frames: mpsc::Sender<Bytes>,
        writer: JoinHandle<Recorded>,
    },
    /// Kept in memory, to be stored whole with the completion.
    InMemory {
        /// Every frame so far; `None` once past the limit.
        frames: Option<Vec<Bytes>>,
        len: usize,
        limit: usize,
    },
}

/// What a recording kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The whole body, in this many pieces after the head.
    Pieces(u32),
    /// The whole body, in memory ([`Recording::in_memory`]).
    Whole(Bytes),
    /// Not all of it: past the limit, fenced off, or the store failed.
    NotRetained(Lost),
}

/// Why a recording kept less than the whole stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The stream outgrew the stored-response limit.
    OverLimit,
    /// The store refused a piece: the record no longer holds the run's lease.
    Fenced,
    /// The store stayed unavailable through an append's attempts.
    StoreFailed,
}

impl Recording {
    /// Starts recording the stream of `lease`'s run, whose head piece is
    /// `head` ([`idemgate_core::stream::encode_head`]), keeping at most
    /// `limit` body bytes.
    ///
    /// The head is appended before this returns, and the run sends its client
    /// the answer's head only then: a retry that follows anything the client
    /// saw finds the stream to join. That is one store write before the first
    /// byte; the body's pieces follow it without holding the client.
    pub(crate) async fn start(
        store: Arc<dyn Store>,
        lease: Lease,
        head: Bytes,
        limit: usize,
    ) -> Self {
        let lost = append(store.as_ref(), &lease, HEAD_PIECE, &head)
            .await
            .err();
        if lost == Some(Lost::StoreFailed) {
            // The head may have landed all the same (an unknown outcome).
            abandon(store.as_ref(), &lease, HEAD_PIECE + 1).await;
        }
        let (frames, queued) = mpsc::channel(FRAMES_QUEUED);
        let writer = tokio::spawn(write_pieces(store, lease, lost, limit, queued));
        Self::InStore { frames, writer }
    }

    /// Keeps the stream in memory, at most `limit` bytes: for a run whose
    /// handler holds a transaction (see the module's docs).
    pub(crate) fn in_memory(limit: usize) -> Self {
        Self::InMemory {
            frames: Some(Vec::new()),
            len: 0,
            limit,
        }
    }

    /// One more frame. In the store: handed to the writer, waiting while
    /// [`FRAMES_QUEUED`] frames wait already.
    pub(crate) async fn push(&mut self, data: Bytes) {
        match self {
            // A writer that stopped early keeps reading (and dropping)
            // frames, so the send fails only if it panicked; `finish` says so.
            Self::InStore { frames, .. } => drop(frames.send(data).await),
            Self::InMemory { frames, len, limit } => {
                *len = len.saturating_add(data.len());
                if *len > *limit {
                    *frames = None;
                } else if let Some(frames) = frames {
                    frames.push(data);
                }
            }
        }
    }

    /// The stream ended: waits for the last pieces and says what was kept.
    pub(crate) async fn finish(self) -> Recorded {
        match self {
            Self::InStore { frames, writer } => {
                drop(frames);
                match writer.await {
                    Ok(recorded) => recorded,
                    Err(error) => {
                        tracing::error!(%error, "the stream's recording task failed");
                        Recorded::NotRetained(Lost::StoreFailed)
                    }
                }
            }
            Self::InMemory {
                frames: Some(frames),
                ..
            } => Recorded::Whole(frames.concat().into()),
            Self::InMemory { frames: None, .. } => Recorded::NotRetained(Lost::OverLimit),
        }
    }
}

/// The writer: the frames in pieces after the head, until the stream ends;
/// `lost` when the head already was.
async fn write_pieces(
    store: Arc<dyn Store>,
    lease: Lease,
    mut lost: Option<Lost>,
    limit: usize,
    mut queued: mpsc::Receiver<Bytes>,
) -> Recorded {
    let mut next = HEAD_PIECE + 1;
    let mut len = 0usize;
    let mut frames = Vec::with_capacity(FRAMES_QUEUED);
    while queued.recv_many(&mut frames, FRAMES_QUEUED).await > 0 {
        if lost.is_some() {
            frames.clear();
            continue;
        }
        len = frames
            .iter()
            .fold(len, |len, frame| len.saturating_add(frame.len()));
        if len > limit {
            lost = Some(Lost::OverLimit);
        } else {
            for piece in pieces(frames.drain(..)) {
                if let Err(why) = append(store.as_ref(), &lease, next, &piece).await {
                    lost = Some(why);
                    break;
                }
                next += 1;
            }
        }
        frames.clear();
        if let Some(why) = lost
            && why != Lost::Fenced
        {
            abandon(store.as_ref(), &lease, next).await;
        }
    }
    match lost {
        None => Recorded::Pieces(next - 1),
        Some(why) => Recorded::NotRetained(why),
    }
}

/// Marks the recording stopped, in two empty pieces (a recorded piece is
/// never empty): first one over the head, so that a later retry does not join
/// a stream that cannot be replayed but waits for the outcome, then one where
/// the next would have gone, which cuts the readers following the stream (in
/// this order, a retry that follows a cut reader's never joins).
/// Best effort, one try each: readers also learn it from the record,
/// completed not retained, and the stream must not wait for a failing store.
async fn abandon(store: &dyn Store, lease: &Lease, next: u32) {
    for index in [HEAD_PIECE, next] {
        let marked = store.append_stream_piece(lease, index, &Bytes::new()).await;
        if !matches!(marked, Ok(FencedWrite::Applied)) {
            return;
        }
    }
}

/// `frames` joined into pieces of at most [`PIECE_BUDGET`] bytes, in order:
/// small frames share a piece (copied together), a larger one is split into
/// slices of itself; a frame that makes a piece alone is not copied.
fn pieces(frames: impl Iterator<Item = Bytes>) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    let mut pending = Pending::Empty;
    for mut frame in frames {
        while !frame.is_empty() {
            let room = PIECE_BUDGET - pending.len();
            pending = pending.add(frame.split_to(frame.len().min(room)));
            if pending.len() == PIECE_BUDGET {
                pieces.push(pending.take());
            }
        }
    }
    if pending.len() > 0 {
        pieces.push(pending.take());
    }
    pieces
}

/// The piece being made.
enum Pending {
    Empty,
    /// One part, as it came.
    One(Bytes),
    /// Several parts, copied together.
    Joined(BytesMut),
}

impl Pending {
    fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::One(part) => part.len(),
            Self::Joined(joined) => joined.len(),
        }
    }

    fn add(self, part: Bytes) -> Self {
        match self {
            Self::Empty => Self::One(part),
            Self::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + part.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&part);
                Self::Joined(joined)
            }
            Self::Joined(mut joined) => {
                joined.extend_from_slice(&part);
                Self::Joined(joined)
            }
        }
    }

    fn take(&mut self) -> Bytes {
        match std::mem::replace(self, Self::Empty) {
            Self::Empty => Bytes::new(),
            Self::One(part) => part,
            Self::Joined(joined) => joined.freeze(),
        }
    }
}

/// Appends one piece, trying again while the store is unavailable.
async fn append(store: &dyn Store, lease: &Lease, index: u32, piece: &Bytes) -> Result<(), Lost> {
    let mut attempt = 1;
    loop {
        match store.append_stream_piece(lease, index, piece).await {
            Ok(FencedWrite::Applied) => return Ok(()),
            Ok(FencedWrite::Refused) => return Err(Lost::Fenced),
            Err(error @ StoreError::Unavailable(_)) if attempt < APPEND_ATTEMPTS => {
                tracing::warn!(%error, attempt, "appending a stream piece failed; trying again");
                attempt += 1;
                tokio::time::sleep(APPEND_RETRY_PAUSE).await;
            }
            Err(error) => {
                tracing::error!(%error, "appending a stream piece failed; the stream is not retained");
                return Err(Lost::StoreFailed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(pieces: &[Bytes]) -> Vec<usize> {
        pieces.iter().map(Bytes::len).collect()
    }

    #[test]
    fn frames_are_coalesced_and_split_at_the_budget() {
        let frame = |len: usize| Bytes::from(vec![7u8; len]);
        assert_eq!(sizes(&pieces([frame(10), frame(20)].into_iter())), [30]);
        assert_eq!(
            sizes(&pieces([frame(PIECE_BUDGET * 2 + 5)].into_iter())),
            [PIECE_BUDGET, PIECE_BUDGET, 5]
        );
        assert_eq!(
            sizes(&pieces(
                [frame(PIECE_BUDGET - 1), frame(3), frame(0)].into_iter()
            )),
            [PIECE_BUDGET, 2]
        );
        assert!(pieces(std::iter::empty()).is_empty());
        // A frame that makes a piece alone, or a budget's slice of a larger
        // one, is passed on, not copied.
        let event = frame(300);
        assert_eq!(
            pieces([event.clone()].into_iter())[0].as_ptr(),
            event.as_ptr()
        );
        let large = frame(PIECE_BUDGET + 7);
        assert_eq!(
            pieces([large.clone()].into_iter())[0].as_ptr(),
            large.as_ptr()
        );
        let bytes: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let joined: Vec<u8> = pieces(bytes.chunks(777).map(Bytes::copy_from_slice)).concat();
        assert_eq!(joined, bytes, "the bytes, in order");
    }
}
