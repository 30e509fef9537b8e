//! A streamed answer's record in pieces (PROTOCOL §20).
//!
//! A stream is recorded as it flows, not held whole: the layer appends it to
//! the store in numbered pieces ([`crate::Store::append_stream_piece`]) —
//! piece 0 its head (status and storable headers, [`encode_head`]), then its
//! body in pieces of at most [`PIECE_BUDGET`] bytes — and completes the record
//! with [`crate::record::StoredBody::InPieces`]. A retry reads the pieces back
//! ([`crate::Store::read_stream_pieces`]): live while the run goes on, woken
//! by the store's change announcements, on any instance sharing the store;
//! and after the end, as the replay, piece by piece.
//!
//! The pieces belong to one run — its operation id and fencing token
//! ([`StreamId`]) — so a takeover's run records a stream of its own, and a
//! reader never mixes two runs' bytes. They live as long as the record that
//! names them and are gone with it (expiry, eviction, deletion).

use bytes::Bytes;
use http::StatusCode;
use http::header::{HeaderName, HeaderValue};

use crate::record::{DecodeError, FencingToken, OperationId, Record, StoredBody, StoredResponse};
use crate::scope::IdentityDigest;

/// The most bytes one body piece holds: what a stream's recording keeps in
/// memory at once beyond the frames on their way, and what a reader holds
/// per piece. A frame larger than it is split.
pub const PIECE_BUDGET: usize = 64 * 1024;

/// The index of a stream's head piece; its body pieces follow from 1.
pub const HEAD_PIECE: u32 = 0;

/// Which run's stream: the record's identity and the run's operation id and
/// fencing token ([`crate::Lease::stream`] names its run's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamId {
    /// The record's identity.
    pub identity: IdentityDigest,
    /// The operation.
    pub operation_id: OperationId,
    /// The run's token: a takeover's run streams under its own.
    pub token: FencingToken,
}

impl StreamId {
    /// The stream of the run `record` (found under `identity`) names: the one
    /// in flight, or the one its completion replays.
    pub fn of_record(identity: IdentityDigest, record: &Record) -> Self {
        Self {
            identity,
            operation_id: record.operation_id,
            token: record.token,
        }
    }
}

/// The head piece: the stream's status and storable headers, in
/// [`StoredResponse::encode`]'s layout with no body.
pub fn encode_head(status: StatusCode, headers: Vec<(HeaderName, HeaderValue)>) -> Bytes {
    StoredResponse {
        trailers: Vec::new(),
        status,
        headers,
        body: StoredBody::NotRetained,
    }
    .encode()
}

/// Reverses [`encode_head`].
pub fn decode_head(
    piece: Bytes,
) -> Result<(StatusCode, Vec<(HeaderName, HeaderValue)>), DecodeError> {
    let head = StoredResponse::decode(piece)?;
    Ok((head.status, head.headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_round_trip() {
        let headers = vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        )];
        let piece = encode_head(StatusCode::OK, headers.clone());
        assert_eq!(decode_head(piece).unwrap(), (StatusCode::OK, headers));
        assert!(decode_head(Bytes::from_static(b"\x01\x00")).is_err());
    }
}
