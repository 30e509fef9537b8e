"""The ``text/event-stream`` format (the HTML standard's Server-Sent Events,
"Interpreting an event stream"), as far as resuming a stream needs it: where
each event block ends, what it carries, and the id it sets.

This is the Rust ``idemgate_core::event_stream`` line for line, because both
ends of PROTOCOL §20's resumption must read a stream the same way: the server
resumes a stored stream just after the first block whose id is the retry's
``Last-Event-ID`` (:func:`resume_offset`), and a client that reconnects with
that id knows from the same reading where the replay starts, so it hands each
event to its caller once.

Written here rather than taken from PyPI (``httpx-sse``, ``sseclient``): those
parse events well but do not say at which byte of the stream each event ends,
and the offsets are what a resumed stream is matched against. The reading is
small and tested piece size by piece size (``tests/test_event_stream.py``).

Lines end in CRLF, LF or CR; an empty line ends a block; a line starting with
``:`` is a comment; a field's value follows its first ``:`` without one leading
space. An ``id`` field whose value holds NUL is ignored. A last line without its
ending belongs to no block (the standard dispatches nothing for it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

#: The header a client reconnects with, carrying the last event id it received
#: (the HTML standard's ``Last-Event-ID``).
LAST_EVENT_ID = "last-event-id"

_LINE_END = re.compile(rb"[\r\n]")


@dataclass(frozen=True)
class EventBlock:
    """One block of an event stream: its lines up to the empty line that ends it."""

    #: Where the block ends in the stream: the offset just after its empty line.
    end: int
    #: Its last ``event`` field's value; ``None``: the default type, ``message``.
    event: Optional[str] = None
    #: Its ``data`` lines' values joined with LF; ``None`` when it has no
    #: ``data`` line — a block a browser dispatches no event for (only its id
    #: counts).
    data: Optional[str] = None
    #: Its last ``id`` field's value, when it has one: the stream's last event id
    #: from this block on (an empty one clears it).
    id: Optional[str] = None


class EventStreamReader:
    """Reads an event stream's bytes as they arrive, block by block.

    >>> reader = EventStreamReader()
    >>> reader.feed(b"id: 1\\ndata: a")
    []
    >>> first, ping = reader.feed(b"\\n\\n: ping\\n\\n")
    >>> (first.data, first.id, first.end), ping.data
    (('a', '1', 15), None)
    """

    def __init__(self, offset: int = 0) -> None:
        """A reader of a stream's bytes from its ``offset``-th on, which must be
        the end of a block (a resumed replay): the blocks it returns carry their
        offsets in the whole stream."""
        # The bytes of the line not yet ended, and the stream offset of its first.
        self._line = bytearray()
        self._at = offset
        # The block being read (its fields so far), and whether any line of it was.
        self._event: Optional[str] = None
        self._data: Optional[List[str]] = None
        self._id: Optional[str] = None
        self._started = False

    @classmethod
    def starting_at(cls, offset: int) -> EventStreamReader:
        """``EventStreamReader(offset)``, named as in Rust."""
        return cls(offset)

    def feed(self, chunk: bytes) -> list[EventBlock]:
        """The blocks ``chunk``, the stream's next bytes, complete, in order."""
        self._line += chunk
        blocks: list[EventBlock] = []
        start = 0
        while True:
            found = _LINE_END.search(self._line, start)
            if found is None:
                break
            end_of_line = found.start()
            if self._line[end_of_line] == 0x0D:  # CR
                if end_of_line + 1 == len(self._line):
                    break  # a CR at the end so far: an LF may still follow it
                ending = 2 if self._line[end_of_line + 1] == 0x0A else 1
            else:
                ending = 1
            following = end_of_line + ending
            line = self._line[start:end_of_line].decode("utf-8", "replace")
            block = self._read_line(line, self._at + following)
            if block is not None:
                blocks.append(block)
            start = following
        del self._line[:start]
        self._at += start
        return blocks

    def finish(self) -> Optional[EventBlock]:
        """The stream ended: the block a last lone CR ends, if it does."""
        if self._line != b"\r":
            return None
        self._line.clear()
        self._at += 1
        return self._read_line("", self._at)

    def _read_line(self, line: str, end: int) -> Optional[EventBlock]:
        """Takes one line, which ends at stream offset ``end``; the block it ends."""
        if not line:
            if not self._started:
                return None
            block = EventBlock(
                end=end,
                event=self._event,
                data=None if self._data is None else "\n".join(self._data),
                id=self._id,
            )
            self._event, self._data, self._id, self._started = None, None, None, False
            return block
        self._started = True
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def read_all(stream: bytes) -> list[EventBlock]:
    """Every block of a whole stream."""
    reader = EventStreamReader()
    blocks = reader.feed(stream)
    last = reader.finish()
    return blocks if last is None else [*blocks, last]


def resume_offset(stream: bytes, last_event_id: str) -> Optional[int]:
    """Where a stored event stream resumes for a client whose last event id is
    ``last_event_id``: just after the first block whose id is that id. ``None``
    when no block has it: the whole stream is sent, a duplicate being better than
    a gap. (The server's rule; here for the tests that hold the client to it.)

    >>> stream = b"id: 1\\ndata: a\\n\\nid: 2\\ndata: b\\n\\n"
    >>> resume_offset(stream, "1"), resume_offset(stream, "3")
    (15, None)
    """
    return next((block.end for block in read_all(stream) if block.id == last_event_id), None)
