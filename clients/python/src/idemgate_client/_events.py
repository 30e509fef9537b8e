"""Streamed answers (PROTOCOL §20): what a client hands on of an event stream,
and where it asks for the stream again when the connection drops mid-stream.

The server answers such a retry (same key, same body) from the operation's one
stream: joined while it is produced, or replayed once it is stored, starting
just after the first block whose id is the retry's ``Last-Event-ID`` — or at
the start when the retry carries none. Both ends read the format the same way
(:mod:`._event_stream`), so the client knows the stream offset the answer
starts at and passes over what it already handed on. The HTTP side — attempts,
waits, deadlines — is ``_client.py``'s :class:`Events` and :class:`AsyncEvents`;
this is the bookkeeping they share, with no I/O, the Rust client's ``Events``.
"""

from __future__ import annotations

import json as jsonlib
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterable, Optional

from ._event_stream import EventBlock, EventStreamReader

#: A ``Last-Event-ID`` value the server reads back as sent: visible ASCII, inner
#: spaces or tabs only. The server ignores a value that is not visible ASCII and
#: HTTP strips a value's outer whitespace, so an id outside this would not
#: resume where the client expects: such a stream is asked for whole instead.
_SENDABLE_ID = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")


@dataclass(frozen=True)
class Event:
    """One event of a stream, as a browser's ``EventSource`` dispatches it."""

    #: Its data: the ``data`` lines joined with LF.
    data: str
    #: Its type: the ``event`` field, ``message`` without one.
    kind: str = "message"
    #: The stream's last event id when it arrived (its own ``id``, or the one an
    #: earlier event set); ``None`` when none was set.
    last_event_id: Optional[str] = None

    def json(self) -> Any:
        """The data as JSON (the form most APIs stream)."""
        return jsonlib.loads(self.data)


class StreamState:
    """What was read of one operation's stream, over all its attempts: the events
    ready to hand on, the offset read to, and the ids seen."""

    def __init__(self) -> None:
        self._reader = EventStreamReader()
        self.ready: Deque[Event] = deque()
        #: The stream offset just after the last block handed on or passed over.
        self.read_to = 0
        #: The stream's last event id so far.
        self.last_event_id: Optional[str] = None
        # Where the first block with each id ended: a stream resumed after an id
        # starts there (the server resumes after the *first* block with it).
        self._first_end_of: Dict[str, int] = {}

    def feed(self, chunk: bytes) -> None:
        """Reads the answer's next bytes."""
        self._take(self._reader.feed(chunk))

    def finish(self) -> None:
        """The answer ended cleanly: the stream's last block, if a lone CR ends it."""
        last = self._reader.finish()
        if last is not None:
            self._take([last])

    def resumption(self) -> tuple[Optional[str], int]:
        """The ``Last-Event-ID`` to ask for the stream again with (``None``: none),
        and the stream offset the answer will then start at."""
        last = self.last_event_id
        if last is not None and _SENDABLE_ID.fullmatch(last):
            return last, self._first_end_of[last]
        return None, 0  # no id, or one no header carries back: the whole stream

    def resume_at(self, offset: int) -> None:
        """A new answer, starting at stream offset ``offset`` (from
        :meth:`resumption`), follows: what came of the cut one's unfinished
        block is dropped, and the blocks up to :attr:`read_to` are passed over."""
        self._reader = EventStreamReader.starting_at(offset)

    def _take(self, blocks: Iterable[EventBlock]) -> None:
        """Hands on the blocks past what was read before, as events."""
        for block in blocks:
            if block.end <= self.read_to:
                continue  # handed on before the connection dropped
            self.read_to = block.end
            if block.id is not None:
                self._first_end_of.setdefault(block.id, block.end)
                self.last_event_id = block.id or None  # an empty id clears it
            if block.data is not None:
                self.ready.append(
                    Event(data=block.data, kind=block.event or "message", last_event_id=self.last_event_id)
                )
