"""The ``text/event-stream`` reading (``_event_stream.py``) and what a client
hands on of a stream across a resumption (``_events.py``), without a network:
the cases of the Rust ``idemgate_core::event_stream`` tests, and a few more.
The reading must be the server's byte for byte, or a resumed stream would
repeat or skip events."""

from __future__ import annotations

import random

from idemgate_client._event_stream import EventBlock, EventStreamReader, read_all, resume_offset
from idemgate_client._events import Event, StreamState

#: Every rule in one stream: CRLF, LF and CR line ends (a CR then a CR), a
#: comment block, an ``id`` alone, a ``data`` alone, a last lone CR.
MIXED = b"event: start\r\nid: 7\r\ndata: one\r\ndata:two\r\n\r\n: keep-alive\n\nid\rdata\r\rdata: x\n\r"


def read_in_pieces(stream: bytes, sizes: list[int] | int) -> list[EventBlock]:
    """The blocks of ``stream`` fed in pieces of ``sizes`` (one size, or a list
    cycled through), then finished."""
    cycle = [sizes] if isinstance(sizes, int) else sizes
    reader = EventStreamReader()
    blocks: list[EventBlock] = []
    at, turn = 0, 0
    while at < len(stream):
        size = cycle[turn % len(cycle)]
        blocks += reader.feed(stream[at : at + size])
        at, turn = at + size, turn + 1
    last = reader.finish()
    return blocks if last is None else [*blocks, last]


def test_blocks_are_the_same_however_the_bytes_arrive() -> None:
    whole = read_in_pieces(MIXED, len(MIXED))
    for piece in range(1, len(MIXED)):
        assert read_in_pieces(MIXED, piece) == whole, f"pieces of {piece}"
    shuffle = random.Random(20)
    for _ in range(200):
        sizes = [shuffle.randint(1, 9) for _ in range(shuffle.randint(1, 6))]
        assert read_in_pieces(MIXED, sizes) == whole, f"pieces of {sizes}"
    assert len(whole) == 4, whole
    assert whole[0] == EventBlock(end=len(b"event: start\r\nid: 7\r\ndata: one\r\ndata:two\r\n\r\n"), event="start", data="one\ntwo", id="7")
    assert whole[0].end == 44
    assert whole[1].data is None, "a comment: no data"
    # `id` alone clears the last event id; `data` alone is an empty event.
    assert whole[2].id == "" and whole[2].data == ""
    # A stream's last lone CR ends its last line.
    assert whole[3].data == "x" and whole[3].end == len(MIXED)


def test_an_unfinished_last_line_ends_no_block_and_a_nul_id_is_ignored() -> None:
    reader = EventStreamReader()
    blocks = reader.feed(b"id: a\0b\ndata: x\n\ndata: y\n")
    assert len(blocks) == 1
    assert blocks[0].id is None
    assert reader.finish() is None
    # A block whose last line lacks its empty line is not one either.
    assert read_all(b"data: z") == []


def test_a_reader_started_at_a_block_end_carries_the_whole_streams_offsets() -> None:
    stream = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n"
    start = resume_offset(stream, "1")
    assert start == 15
    assert resume_offset(stream, "3") is None
    resumed = EventStreamReader.starting_at(start).feed(stream[start:])
    assert resumed == read_in_pieces(stream, 3)[1:]


def test_a_field_value_loses_one_leading_space_and_a_field_without_colon_is_empty() -> None:
    (block,) = read_all(b"data:  two spaces\ndata\nevent:tick\nretry: 10\nid: x: y\n\n")
    assert block.data == " two spaces\n", "one space dropped, the second kept; `data` alone adds an empty line"
    assert block.event == "tick"
    assert block.id == "x: y", "the value follows the first colon"


def test_a_cr_at_a_pieces_end_waits_for_a_possible_lf() -> None:
    reader = EventStreamReader()
    assert reader.feed(b"data: a\r") == []
    assert reader.feed(b"\n") == []
    (block,) = reader.feed(b"\r\n")
    assert (block.data, block.end) == ("a", 11), "CRLF CRLF: two line ends, not three"


def test_the_resumption_asks_from_the_first_block_with_the_last_id() -> None:
    state = StreamState()
    state.feed(b"id: 1\ndata: a\n\nid: 1\ndata: b\n\n: ping\n\ndata: c\n\n")
    assert [event.data for event in state.ready] == ["a", "b", "c"]
    assert [event.last_event_id for event in state.ready] == ["1", "1", "1"], "an event keeps the last id"
    # The server resumes just after the *first* block whose id is 1.
    assert state.resumption() == ("1", 15)
    state.feed(b"id\n\n")
    assert state.last_event_id is None, "an empty id clears it"
    assert state.resumption() == (None, 0), "no id: the whole stream"


def test_an_id_no_header_carries_back_asks_for_the_whole_stream() -> None:
    for odd in ("caf\u00e9", " padded", "tab\tend\t", "bell\x07"):
        state = StreamState()
        state.feed(f"id: {odd}\ndata: a\n\n".encode())
        assert state.last_event_id == odd
        assert state.resumption() == (None, 0), repr(odd)
    state = StreamState()
    state.feed(b"id: chat 1\ttoken 2\ndata: a\n\n")
    assert state.resumption() == ("chat 1\ttoken 2", 28)


def test_a_resumed_answer_hands_on_only_what_was_not_handed_on() -> None:
    stream = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\nid: 3\ndata: c\n\nid: 4\ndata: d\n\n"
    for cut in range(len(stream)):
        for with_id in (True, False):
            state = StreamState()
            state.feed(stream[:cut])
            handed = [event.data for event in state.ready]
            state.ready.clear()
            last, start = state.resumption() if with_id else (None, 0)
            if last is not None:
                assert start == resume_offset(stream, last), "where the server resumes"
            # The cut answer's unfinished block is dropped; the new one starts at `start`.
            state.resume_at(start)
            for at in range(start, len(stream), 5):
                state.feed(stream[at : at + 5])
            state.finish()
            handed += [event.data for event in state.ready]
            assert handed == ["a", "b", "c", "d"], (cut, with_id)


def test_an_event_is_a_message_unless_it_says_otherwise() -> None:
    state = StreamState()
    state.feed(b'data: {"n": 1}\n\nevent: done\ndata: [DONE]\n\nevent:\ndata: x\n\n')
    first, done, empty = state.ready
    assert first == Event(data='{"n": 1}', kind="message", last_event_id=None)
    assert first.json() == {"n": 1}
    assert done.kind == "done"
    assert empty.kind == "message", "an empty event type is the default (the HTML standard)"
