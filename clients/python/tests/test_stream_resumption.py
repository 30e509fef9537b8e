"""The resumption rules of ``Client.stream`` and ``AsyncClient.stream`` against
a scripted server (``httpx.MockTransport``): a stream cut at every byte is
handed on whole, each event once; the answers a resumption can get — a replay
from the ``Last-Event-ID``, a ``409`` waited out, a ``422``, a new run — end as
they must. The real server and proxy are ``tests/test_events.py``'s."""

from __future__ import annotations

from typing import AsyncIterator, Callable, Iterator, Optional, Union

import anyio
import httpx
import pytest

from conftest import QUICK
from idemgate_client import (
    AsyncClient,
    Client,
    KeyReusedError,
    Operation,
    RetryPolicy,
    StreamRestartedError,
    TransportError,
)
from idemgate_client._event_stream import EventStreamReader, resume_offset


def stream_of(with_ids: bool) -> bytes:
    """Five events, in the line ends and shapes a server may send."""
    ids = [f"id: {n}\r\n" if with_ids else "" for n in range(1, 6)]
    return (
        f"{ids[0]}data: one\r\n\r\n"
        f": keep-alive\n\n{ids[1]}event: token\ndata: two\ndata: lines\n\n"
        f"{ids[2]}data: three\r\r{ids[3]}data: four\n\n"
        f"retry: 100\n{ids[4]}data: five\n\n"
    ).encode()


EXPECTED = ["one", "two\nlines", "three", "four", "five"]


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An answer's body: ``data`` in pieces of ``piece`` bytes, then — when
    ``cut`` — a transport failure instead of its end."""

    def __init__(self, data: bytes, *, cut: bool, piece: int = 7) -> None:
        self.data, self.cut, self.piece = data, cut, piece

    def _pieces(self) -> Iterator[bytes]:
        for at in range(0, len(self.data), self.piece):
            yield self.data[at : at + self.piece]

    def __iter__(self) -> Iterator[bytes]:
        yield from self._pieces()
        if self.cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces():
            yield piece
        if self.cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


#: One scripted answer: a status alone (a problem), or the stream from the
#: offset the request's Last-Event-ID gives, cut after `int` bytes (None: whole).
Answer = Union[int, tuple[str, Optional[int]]]


class Script:
    """Answers the requests in turn, and notes their ``Last-Event-ID``."""

    def __init__(self, stream: bytes, answers: list[Answer]) -> None:
        self.stream, self.answers = stream, answers
        self.asked_from: list[Optional[str]] = []
        self.keys: set[Optional[str]] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        last = request.headers.get("last-event-id")
        self.asked_from.append(last)
        self.keys.add(request.headers.get("idempotency-key"))
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            slug = {409: "in-progress", 422: "key-reused"}.get(answer, "upstream")
            headers = {"content-type": "application/problem+json", "retry-after": "0"}
            body = b'{"type":"/problems/%s","status":%d}' % (slug.encode(), answer)
            return httpx.Response(answer, headers=headers, content=body)
        kind, cut_after = answer
        start = 0 if last is None else (resume_offset(self.stream, last) or 0)
        rest = self.stream[start:]
        headers = {"content-type": "text/event-stream"}
        if kind == "replay":
            headers["idempotent-replayed"] = "true"
        if cut_after is None:
            return httpx.Response(200, headers=headers, stream=Body(rest, cut=False))
        return httpx.Response(200, headers=headers, stream=Body(rest[:cut_after], cut=True))


def read_sync(script: Script, policy: RetryPolicy = QUICK) -> tuple[list[str], int]:
    with Client(httpx.Client(transport=httpx.MockTransport(script)), policy=policy) as client:
        with client.stream("POST", "http://api.test/v1/chat", operation=Operation(), json={"q": 1}) as events:
            return [event.data for event in events], events.attempts


def read_async(script: Script, policy: RetryPolicy = QUICK) -> tuple[list[str], int]:
    async def run() -> tuple[list[str], int]:
        async with AsyncClient(httpx.AsyncClient(transport=httpx.MockTransport(script)), policy=policy) as client:
            async with client.stream("POST", "http://api.test/v1/chat", operation=Operation(), json={"q": 1}) as events:
                return [event.data async for event in events], events.attempts

    return anyio.run(run)


Read = Callable[..., "tuple[list[str], int]"]


@pytest.fixture(params=["sync", "async"])
def read(request: pytest.FixtureRequest) -> Read:
    return read_sync if request.param == "sync" else read_async


@pytest.mark.parametrize("with_ids", [True, False], ids=["ids", "no-ids"])
def test_a_stream_cut_at_any_byte_is_handed_on_whole_each_event_once(read: Read, with_ids: bool) -> None:
    stream = stream_of(with_ids)
    for cut in range(len(stream)):
        script = Script(stream, [("run", cut), ("replay", None)])
        assert read(script) == (EXPECTED, 2), f"cut after {cut} bytes"
        assert len(script.keys) == 1, "one key for both attempts"
        # The last id of the blocks complete before the cut (a CR at the cut
        # still waited for a possible LF: its block was not).
        ids = [block.id for block in EventStreamReader().feed(stream[:cut]) if block.id]
        assert script.asked_from == [None, ids[-1] if ids else None], f"cut after {cut} bytes"


def test_a_stream_cut_twice_resumes_twice(read: Read) -> None:
    stream = stream_of(True)
    # Event 1 ends at byte 20, event 2 at 77: cut after the first, then the second.
    script = Script(stream, [("run", 20), ("replay", 60), ("replay", None)])
    assert read(script) == (EXPECTED, 3)
    assert script.asked_from == [None, "1", "2"]


def test_a_409_on_the_resumption_is_waited_out(read: Read) -> None:
    script = Script(stream_of(True), [("run", 80), 409, 503, ("replay", None)])
    assert read(script) == (EXPECTED, 4)
    assert script.asked_from == [None, "2", "2", "2"]


def test_a_422_on_the_resumption_ends_it(read: Read) -> None:
    script = Script(stream_of(True), [("run", 40), 422])
    with pytest.raises(KeyReusedError) as raised:
        read(script)
    assert raised.value.attempts == 2


def test_a_resumption_answered_by_a_new_run_is_an_error(read: Read) -> None:
    script = Script(stream_of(True), [("run", 40), ("run", None)])
    with pytest.raises(StreamRestartedError) as raised:
        read(script)
    assert raised.value.may_have_run and raised.value.attempts == 2


def test_no_retries_left_is_a_transport_error_that_may_have_run(read: Read) -> None:
    script = Script(stream_of(True), [("run", 40)])
    with pytest.raises(TransportError) as raised:
        read(script, QUICK.replace(max_retries=0))
    assert raised.value.may_have_run and raised.value.attempts == 1
    assert isinstance(raised.value.__cause__, httpx.RemoteProtocolError)


def test_the_events_before_an_error_are_handed_on_first() -> None:
    script = Script(stream_of(True), [("run", 80), ("run", None)])
    received: list[str] = []
    with Client(httpx.Client(transport=httpx.MockTransport(script)), policy=QUICK) as client:
        with client.stream("POST", "http://api.test/v1/chat", operation=Operation(), json={}) as events:
            with pytest.raises(StreamRestartedError):
                for event in events:
                    received.append(event.data)
            assert list(events) == [], "it ended with the error"
    assert received == EXPECTED[:2]
