"""Streamed answers (PROTOCOL §20) through the real ``idemgate proxy``: a mock of
an external API streaming ``text/event-stream`` (an LLM's completion, say; it
counts its runs and writes each event when the test releases it), the proxy in
front of it, and ``idemgate-relay`` in front of the proxy cutting the
connection in the middle of the third event (``cut-after BYTES``). The client
asks again with the same key — and ``Last-Event-ID`` when the events carry ids —
joins the stream the upstream is still producing, and hands on events 1 to 5
once each, in order; the upstream ran once. And a stream the upstream itself
cuts is never handed on as complete: its resumption gets the stored failure, or
— released — says the operation ran again. The Rust client's tests of the same
names (crates/idemgate-server/tests/client.rs); the first on the sync and the
async client."""

from __future__ import annotations

import queue
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import anyio
import httpx
import pytest

from conftest import QUICK, Proxy, Relay
from idemgate_client import (
    AsyncClient,
    AttemptReport,
    Client,
    Event,
    IdemgateError,
    Operation,
    RejectedError,
    StreamRestartedError,
    TransportError,
)

PATH = "/v1/chat/completions"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"authorization": "Bearer alice"}

#: What the test releases to the upstream's stream: an event's bytes, the
#: clean end, or a cut (the upstream's connection closes mid-stream).
END, CUT = "end", "cut"
Release = Union[bytes, str]


@dataclass
class StreamingUpstream:
    """``POST`` answers ``200 text/event-stream``, chunked, each released event
    one chunk (its size line, the event, CRLF); each run takes the releases from
    one queue, and is counted."""

    server: ThreadingHTTPServer
    released: queue.Queue[Release] = field(default_factory=queue.Queue)
    executions: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def release(self, *what: Release) -> None:
        for one in what:
            self.released.put(one)


@pytest.fixture
def upstream() -> Iterator[StreamingUpstream]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", 0)))
            with lock:
                mock.executions += 1
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.close_connection = True
            while True:
                try:
                    what = mock.released.get(timeout=20)
                except queue.Empty:
                    return  # the test is gone: the body ends short
                if what == END:
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if what == CUT:
                    return  # closed without the last chunk: a broken stream
                assert isinstance(what, bytes)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(what), what))

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    mock = StreamingUpstream(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield mock
    server.shutdown()
    server.server_close()


class Stack:
    """The upstream, ``idemgate proxy`` in front of it (with ``routes`` when
    given), the relay in front of the proxy."""

    def __init__(self, upstream: StreamingUpstream, routes: str | None = None) -> None:
        self.dir = tempfile.TemporaryDirectory()
        config = None
        if routes is not None:
            config = str(Path(self.dir.name) / "routes.toml")
            Path(config).write_text(routes)
        self.proxy = Proxy(upstream.url, config=config)
        self.relay = Relay(self.proxy.addr)

    def stop(self) -> None:
        self.relay.stop()
        self.proxy.stop()
        self.dir.cleanup()


@pytest.fixture
def stack(upstream: StreamingUpstream) -> Iterator[Stack]:
    running = Stack(upstream)
    yield running
    running.stop()


def event(n: int, with_ids: bool) -> bytes:
    id_line = f"id: {n}\n" if with_ids else ""
    return f'{id_line}data: {{"token":{n}}}\n\n'.encode()


def chunk(n: int, with_ids: bool) -> int:
    """The bytes event ``n`` takes in a chunked body: its size line, itself, CRLF."""
    size = len(event(n, with_ids))
    return len(f"{size:x}\r\n") + size + 2


@dataclass
class Outcome:
    received: list[Event]
    attempts: int
    replayed: bool
    reports: list[AttemptReport]
    last_event_ids: list[Optional[str]]


def read_cut_stream_sync(stack: Stack, upstream: StreamingUpstream, with_ids: bool) -> Outcome:
    """Events 1 and 2 read as they are released, 3 cut on its way, then 4, 5
    and the end: what the sync client hands on."""
    sent: list[Optional[str]] = []
    http = httpx.Client(
        base_url=stack.relay.url(""),
        headers=HEADERS,
        event_hooks={"request": [lambda request: sent.append(request.headers.get("last-event-id"))]},
    )
    reports: list[AttemptReport] = []
    with Client(http, policy=QUICK) as client, http:
        upstream.release(event(1, with_ids))
        with client.stream("POST", PATH, operation=Operation(), json=BODY, on_attempt=reports.append) as events:
            received = [next(events)]
            upstream.release(event(2, with_ids))
            received.append(next(events))
            upstream.release(event(3, with_ids))  # cut on its way: the client asks again
            received.append(next(events))
            upstream.release(event(4, with_ids), event(5, with_ids), END)
            received += list(events)
        return Outcome(received, events.attempts, events.replayed, reports, sent)


def read_cut_stream_async(stack: Stack, upstream: StreamingUpstream, with_ids: bool) -> Outcome:
    """:func:`read_cut_stream_sync` on the async client."""
    sent: list[Optional[str]] = []

    async def note(request: httpx.Request) -> None:
        sent.append(request.headers.get("last-event-id"))

    async def run() -> Outcome:
        http = httpx.AsyncClient(base_url=stack.relay.url(""), headers=HEADERS, event_hooks={"request": [note]})
        reports: list[AttemptReport] = []
        async with AsyncClient(http, policy=QUICK) as client, http:
            upstream.release(event(1, with_ids))
            async with client.stream("POST", PATH, operation=Operation(), json=BODY, on_attempt=reports.append) as events:
                received = [await events.__anext__()]
                upstream.release(event(2, with_ids))
                received.append(await events.__anext__())
                upstream.release(event(3, with_ids))
                received.append(await events.__anext__())
                upstream.release(event(4, with_ids), event(5, with_ids), END)
                received += [one async for one in events]
            return Outcome(received, events.attempts, events.replayed, reports, sent)

    async def bounded() -> Outcome:
        with anyio.fail_after(20):
            return await run()

    return anyio.run(bounded)


READERS = {"sync": read_cut_stream_sync, "async": read_cut_stream_async}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("with_ids", [True, False], ids=["ids", "no-ids"])
def test_a_dropped_event_stream_is_resumed_and_each_event_handed_on_once(
    stack: Stack, upstream: StreamingUpstream, kind: str, with_ids: bool
) -> None:
    # The relay passes the head and the body up to 8 bytes into the third event.
    cut = chunk(1, with_ids) + chunk(2, with_ids) + 8
    stack.relay.command(f"request cut-after {cut} POST")
    outcome = READERS[kind](stack, upstream, with_ids)
    assert [e.data for e in outcome.received] == [f'{{"token":{n}}}' for n in range(1, 6)], "each once, in order"
    assert [e.json()["token"] for e in outcome.received] == [1, 2, 3, 4, 5]
    assert all(e.kind == "message" for e in outcome.received)
    if with_ids:
        assert [e.last_event_id for e in outcome.received] == ["1", "2", "3", "4", "5"]
        assert outcome.last_event_ids == [None, "2"], "the resumption asked from the last event received"
    else:
        assert all(e.last_event_id is None for e in outcome.received)
        assert outcome.last_event_ids == [None, None], "no id: asked for the whole stream"
    assert outcome.attempts == 2, "the cut and the resumption"
    assert not outcome.replayed, "the first answer was the operation's own run"
    # The head, the cut of the same attempt, then the joined stream.
    assert [(r.attempt, r.status, r.replayed, r.error is not None) for r in outcome.reports] == [
        (1, 200, False, False),
        (1, None, False, True),
        (2, 200, True, False),
    ]
    assert upstream.executions == 1, "the upstream ran once"
    assert stack.relay.stats()["requests"] == 2


@pytest.mark.parametrize("released", [False, True], ids=["kept", "released"])
def test_a_stream_the_upstream_cut_is_never_handed_on_as_complete(upstream: StreamingUpstream, released: bool) -> None:
    # Kept failed (the default, `server_errors = "store"`): the resumption gets
    # the stored failure, replayed, and the upstream ran once. Released: the
    # resumption runs the operation again, and its events are another run's —
    # an error, never spliced onto the first run's.
    routes = f'[[route]]\nmethod = "POST"\npath = "{PATH}"\nserver_errors = "release"\n' if released else None
    stack = Stack(upstream, routes)
    try:
        with Client(base_url=stack.relay.url(""), headers=HEADERS, policy=QUICK) as client:
            upstream.release(event(1, True), event(2, True))
            with client.stream("POST", PATH, operation=Operation(), json=BODY) as events:
                assert [next(events).data for _ in range(2)] == ['{"token":1}', '{"token":2}']
                upstream.release(CUT)  # the upstream breaks off (a second run would stream on)
                with pytest.raises(IdemgateError) as raised:
                    next(events)
                assert list(events) == [], "nothing after the error"
        error = raised.value
        assert error.may_have_run
        assert error.attempts == events.attempts >= 2
        if released:
            assert isinstance(error, StreamRestartedError), repr(error)
            assert upstream.executions == 2, "released: it ran again"
        else:
            assert isinstance(error, RejectedError) and error.replayed, f"the stored failure: {error!r}"
            assert upstream.executions == 1, "kept failed: not run again"
    finally:
        upstream.release(END)
        stack.stop()


def test_without_an_operation_a_dropped_stream_is_not_asked_for_again(
    stack: Stack, upstream: StreamingUpstream
) -> None:
    stack.relay.command(f"request cut-after {chunk(1, True) + 8} POST")
    with Client(base_url=stack.relay.url(""), headers=HEADERS, policy=QUICK) as client:
        upstream.release(event(1, True))
        with client.stream("POST", PATH, json=BODY) as events:
            assert next(events).data == '{"token":1}'
            upstream.release(event(2, True))
            with pytest.raises(TransportError) as raised:
                next(events)
    assert raised.value.may_have_run and raised.value.attempts == 1
    assert isinstance(raised.value.__cause__, httpx.TransportError)
    upstream.release(END)
    assert stack.relay.stats()["requests"] == 1
