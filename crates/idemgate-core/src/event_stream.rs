//! The `text/event-stream` format (the HTML standard's Server-Sent Events,
//! "Interpreting an event stream"), as far as resuming a stream needs it: where
//! each event block ends, what it carries, and the id it sets.
//!
//! One reading for both ends of PROTOCOL §20's resumption: the server resumes a
//! stored stream just after the first block whose id is the retry's
//! `Last-Event-ID` ([`resume_offset`]), and a client that reconnects with that id
//! knows from the same reading where the replay starts, so it hands each event
//! to its caller once.
//!
//! Lines end in CRLF, LF or CR; an empty line ends a block; a line starting with
//! `:` is a comment; a field's value follows its first `:` without one leading
//! space. An `id` field whose value holds NUL is ignored. A last line without
//! its ending belongs to no block (the standard dispatches nothing for it).

/// The header a client reconnects with, carrying the last event id it received
/// (the HTML standard's `Last-Event-ID`).
pub const LAST_EVENT_ID: &str = "last-event-id";

/// One block of an event stream: its lines up to the empty line that ends it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventBlock {
    /// Where the block ends in the stream: the offset just after its empty line.
    pub end: u64,
    /// Its last `event` field's value; `None`: the default type, `message`.
    pub event: Option<String>,
    /// Its `data` lines' values joined with LF; `None` when it has no `data`
    /// line — a block a browser dispatches no event for (only its id counts).
    pub data: Option<String>,
    /// Its last `id` field's value, when it has one: the stream's last event id
    /// from this block on (an empty one clears it).
    pub id: Option<String>,
}

/// Reads an event stream's bytes as they arrive, block by block.
///
/// ```
/// use idemgate_core::event_stream::EventStreamReader;
/// let mut reader = EventStreamReader::default();
/// assert!(reader.feed(b"id: 1\ndata: a").is_empty());
/// let blocks = reader.feed(b"\n\n: ping\n\n");
/// assert_eq!(blocks[0].data.as_deref(), Some("a"));
/// assert_eq!((blocks[0].id.as_deref(), blocks[0].end), (Some("1"), 15));
/// assert_eq!(blocks[1].data, None);
/// ```
#[derive(Debug, Default)]
pub struct EventStreamReader {
    /// The bytes of the line not yet ended.
    line: Vec<u8>,
    /// The stream offset of `line`'s first byte.
    at: u64,
    /// The block being read, and whether any line of it was.
    block: EventBlock,
    started: bool,
}

impl EventStreamReader {
    /// A reader of a stream's bytes from its `offset`-th on, which must be the
    /// end of a block (a resumed replay): the blocks it returns carry their
    /// offsets in the whole stream.
    pub fn starting_at(offset: u64) -> Self {
        Self {
            at: offset,
            ..Self::default()
        }
    }

    /// The blocks `bytes`, the stream's next ones, complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<EventBlock> {
        self.line.extend_from_slice(bytes);
        let mut blocks = Vec::new();
        let mut start = 0;
        while let Some(found) = self.line[start..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
        {
            let end_of_line = start + found;
            let ending = match self.line[end_of_line] {
                b'\r' => match self.line.get(end_of_line + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    // A CR at the end so far: an LF may still follow it.
                    None => break,
                },
                _ => 1,
            };
            let next = end_of_line + ending;
            let line = String::from_utf8_lossy(&self.line[start..end_of_line]).into_owned();
            if let Some(block) = self.read_line(&line, self.at + next as u64) {
                blocks.push(block);
            }
            start = next;
        }
        self.line.drain(..start);
        self.at += start as u64;
        blocks
    }

    /// The stream ended: the block a last lone CR ends, if it does.
    pub fn finish(&mut self) -> Option<EventBlock> {
        if self.line != b"\r" {
            return None;
        }
        self.line.clear();
        self.at += 1;
        self.read_line("", self.at)
    }

    /// Takes one line, which ends at stream offset `end`; the block it ends.
    fn read_line(&mut self, line: &str, end: u64) -> Option<EventBlock> {
        if line.is_empty() {
            if !std::mem::take(&mut self.started) {
                return None;
            }
            let mut block = std::mem::take(&mut self.block);
            block.end = end;
            if let Some(data) = block.data.as_mut() {
                data.pop(); // the LF after the last data line
            }
            return Some(block);
        }
        self.started = true;
        if line.starts_with(':') {
            return None;
        }
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match name {
            "event" => self.block.event = Some(value.to_owned()),
            "data" => {
                let data = self.block.data.get_or_insert_with(String::new);
                data.push_str(value);
                data.push('\n');
            }
            "id" if !value.contains('\0') => self.block.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

/// Where a stored event stream resumes for a client whose last event id is
/// `last_event_id`: just after the first block whose id is that id. `None`
/// when no block has it: the whole stream is sent, a duplicate being better
/// than a gap.
///
/// ```
/// use idemgate_core::event_stream::resume_offset;
/// let stream = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n";
/// assert_eq!(resume_offset(stream, "1"), Some(15));
/// assert_eq!(resume_offset(stream, "3"), None);
/// ```
pub fn resume_offset(stream: &[u8], last_event_id: &str) -> Option<usize> {
    let mut reader = EventStreamReader::default();
    let mut blocks = reader.feed(stream);
    blocks.extend(reader.finish());
    blocks
        .into_iter()
        .find(|block| block.id.as_deref() == Some(last_event_id))
        .and_then(|block| usize::try_from(block.end).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_in_pieces(stream: &[u8], piece: usize) -> Vec<EventBlock> {
        let mut reader = EventStreamReader::default();
        let mut blocks: Vec<_> = stream.chunks(piece).flat_map(|p| reader.feed(p)).collect();
        blocks.extend(reader.finish());
        blocks
    }

    #[test]
    fn blocks_are_the_same_however_the_bytes_arrive() {
        let stream =
            b"event: start\r\nid: 7\r\ndata: one\r\ndata:two\r\n\r\n: keep-alive\n\nid\rdata\r\r\
                       data: x\n\r";
        let whole = read_in_pieces(stream, stream.len());
        for piece in 1..stream.len() {
            assert_eq!(read_in_pieces(stream, piece), whole, "pieces of {piece}");
        }
        assert_eq!(whole.len(), 4, "{whole:?}");
        assert_eq!(whole[0].event.as_deref(), Some("start"));
        assert_eq!(whole[0].id.as_deref(), Some("7"));
        assert_eq!(whole[0].data.as_deref(), Some("one\ntwo"));
        assert_eq!(whole[0].end, 44);
        assert_eq!(whole[1].data, None, "a comment: no data");
        // `id` alone clears the last event id; `data` alone is an empty event.
        assert_eq!(whole[2].id.as_deref(), Some(""));
        assert_eq!(whole[2].data.as_deref(), Some(""));
        // A stream's last lone CR ends its last line.
        assert_eq!(whole[3].data.as_deref(), Some("x"));
        assert_eq!(whole[3].end, stream.len() as u64);
    }

    #[test]
    fn an_unfinished_last_line_ends_no_block_and_a_nul_id_is_ignored() {
        let mut reader = EventStreamReader::default();
        let blocks = reader.feed(b"id: a\0b\ndata: x\n\ndata: y\n");
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].id, None);
        assert_eq!(reader.finish(), None);
    }

    #[test]
    fn a_reader_started_at_a_block_end_carries_the_whole_streams_offsets() {
        let stream = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n";
        let from = resume_offset(stream, "1").unwrap();
        let mut reader = EventStreamReader::starting_at(from as u64);
        let resumed = reader.feed(&stream[from..]);
        assert_eq!(resumed, read_in_pieces(stream, 3)[1..]);
    }
}
