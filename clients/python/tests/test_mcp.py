"""An agent's MCP tool call through ``idemgate proxy`` (issue 37, PROTOCOL §20's
JSON-RPC routes), with the official ``mcp`` SDK on both sides: a real MCP
server (``MCPServer``, Streamable HTTP, answering JSON or an event stream) whose
tool counts its runs, the proxy in front of it with docs/proxy.md's recipe
(``key = "json:/params/_meta/idempotency_key"``, ``jsonrpc = true``), the
``idemgate-relay`` in front of that, and the SDK's ``ClientSession``.

The relay loses the tool call's response: the client's connection is cut
mid-call and its session dies. The agent reconnects (a new session, and the
SDK numbers the retry's JSON-RPC ``id`` anew) and calls again with the same
key: it gets the first run's result — answered with its own ``id``, which the
SDK matches — and the tool ran once.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.server.mcpserver import MCPServer

from conftest import Proxy, Relay

ROUTES = """
[[route]]
method = "POST"
path = "/mcp"
key = "json:/params/_meta/idempotency_key"
jsonrpc = true
"""

HEADERS = {"Authorization": "Bearer agent-1"}


class PaymentsServer:
    """A real MCP server with one tool, ``charge``, that counts its runs; on a
    socket bound here, served by uvicorn from a thread."""

    def __init__(self, json_response: bool) -> None:
        self.runs = 0
        server = MCPServer("payments")

        @server.tool()
        async def charge(amount: int) -> str:
            self.runs += 1
            run = self.runs
            # Long enough to be mid-call when the response is lost.
            await asyncio.sleep(0.2)
            return f"charged {amount}, run {run}"

        app = server.streamable_http_app(stateless_http=True, json_response=json_response)
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.socket]})
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.uvicorn.started:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.socket.close()


class Stack:
    def __init__(self, json_response: bool) -> None:
        self.server = PaymentsServer(json_response)
        self.dir = tempfile.TemporaryDirectory()
        routes = Path(self.dir.name) / "routes.toml"
        routes.write_text(ROUTES)
        self.proxy = Proxy(self.server.url, config=str(routes))
        self.relay = Relay(self.proxy.addr)

    def stop(self) -> None:
        self.relay.stop()
        self.proxy.stop()
        self.server.stop()
        self.dir.cleanup()


@pytest.fixture(params=["json", "event-stream"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    running = Stack(json_response=request.param == "json")
    yield running
    running.stop()


async def call_charge(url: str, key: str, *, lose_the_response: Relay | None = None) -> str:
    """One agent session: initialize, list the tools, call ``charge(5)`` with
    ``key`` in the request's ``_meta``; the text of its result."""
    async with streamable_http_client(url, http_client=create_mcp_http_client(headers=HEADERS)) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            if lose_the_response is not None:
                lose_the_response.fault_requests("lose-response")
            result = await session.call_tool("charge", {"amount": 5}, read_timeout_seconds=10, meta={"idempotency_key": key})
            text = result.content[0].text  # type: ignore[union-attr]
            assert isinstance(text, str)
            return text


def test_a_tool_call_cut_mid_call_and_retried_runs_once(stack: Stack) -> None:
    key = str(uuid.uuid4())
    url = stack.relay.url("/mcp")
    # The relay drops the tool call's response: the SDK's session fails.
    with pytest.raises(Exception):  # noqa: B017 - the SDK raises an ExceptionGroup of transport errors
        asyncio.run(call_charge(url, key, lose_the_response=stack.relay))
    # With an event stream the answer's head (and so the lost response) comes
    # before the tool has run; the proxy runs it to the end without a reader.
    deadline = time.monotonic() + 10
    while stack.server.runs == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stack.server.runs == 1, "the call reached the tool before its response was lost"
    # The agent reconnects and calls again with the same key: the first run's
    # result, matched by the SDK to its new request id; no second run.
    assert asyncio.run(call_charge(url, key)) == "charged 5, run 1"
    assert stack.server.runs == 1, "the tool ran once"
    # Another call (another key) is another operation.
    assert asyncio.run(call_charge(url, str(uuid.uuid4()))) == "charged 5, run 2"
    assert stack.server.runs == 2
