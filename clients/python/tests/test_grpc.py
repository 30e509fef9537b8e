"""Exactly-once unary gRPC calls through ``idemgate proxy`` (issue 34, PROTOCOL
§22), with the real ``grpcio`` on both sides: a gRPC server whose
``shop.Orders/CreateOrder`` counts its runs and answers with custom trailing
metadata, the proxy in front of it (HTTP/2 to the upstream: ``--upstream-protocol
auto`` sends gRPC calls in h2c), and a ``grpcio`` client sending the
``idempotency-key`` metadata — on every store.

- A call whose response is lost (the client's channel closed mid-call) is
  retried on a new channel: the call ran once, and the retry gets the reply and
  the trailing metadata byte for byte, marked ``idempotent-replayed: true``.
- A retry while the call runs waits for its outcome: one run.
- Another message under the key is ``FAILED_PRECONDITION``; nothing runs.
- With ``wait_ms = 0``, a duplicate in flight is ``ABORTED`` with
  ``grpc-retry-pushback-ms``; grpcio's own retry policy (service config
  ``retryPolicy`` retrying ``ABORTED``) waits as told and ends with the single
  outcome.

Messages are raw bytes (no serializers): the proxy never parses them, and no
generated code is needed.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from conftest import Proxy

METHOD = "/shop.Orders/CreateOrder"
TRAILERS = [("x-receipt", "r-{run}"), ("x-receipt-bin", b"\x00\x01\xff")]
AUTH = ("authorization", "Bearer agent-1")


class OrdersServer:
    """A real grpcio server with one unary method that counts its runs; each
    run takes ``pause`` seconds and answers ``order N`` with ``TRAILERS``."""

    def __init__(self) -> None:
        self.runs = 0
        self.pause = 0.0
        self.lock = threading.Lock()
        self.finished = threading.Event()

        def create_order(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self.lock:
                self.runs += 1
                run = self.runs
            time.sleep(self.pause)
            context.set_trailing_metadata(
                [(name, value.format(run=run) if isinstance(value, str) else value) for name, value in TRAILERS]
            )
            self.finished.set()
            return b"order %d for " % run + request

        handler = grpc.method_handlers_generic_handler(
            "shop.Orders", {"CreateOrder": grpc.unary_unary_rpc_method_handler(create_order)}
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


STORES = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param
    if name == "memory":
        yield "memory"
    elif name == "sqlite":
        with tempfile.TemporaryDirectory(prefix="idemgate-grpc-") as directory:
            yield f"sqlite://{Path(directory) / 'records.db'}"
    else:
        variable = f"IDEMGATE_TEST_{name.upper()}_URL"
        url = os.environ.get(variable)
        assert url, f"{variable} is not set: run scripts/test.sh, which starts {name} and exports it"
        yield url


@pytest.fixture
def server() -> Iterator[OrdersServer]:
    orders = OrdersServer()
    yield orders
    orders.stop()


def start_proxy(server: OrdersServer, store: str, routes: str | None = None) -> tuple[Proxy, tempfile.TemporaryDirectory[str]]:
    directory = tempfile.TemporaryDirectory(prefix="idemgate-grpc-routes-")
    config = None
    if routes is not None:
        config = str(Path(directory.name) / "routes.toml")
        Path(config).write_text(routes)
    proxy = Proxy(f"http://127.0.0.1:{server.port}", config=config, store=store)
    return proxy, directory


@pytest.fixture
def proxy(server: OrdersServer, store: str) -> Iterator[Proxy]:
    proxy, directory = start_proxy(server, store)
    yield proxy
    proxy.stop()
    directory.cleanup()


def channel(proxy: Proxy, service_config: dict[str, Any] | None = None) -> grpc.Channel:
    options: list[tuple[str, Any]] = []
    if service_config is not None:
        options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(service_config))]
    return grpc.insecure_channel(proxy.addr, options=options)


def metadata(key: str) -> list[tuple[str, str]]:
    return [("idempotency-key", key), AUTH]


def call(proxy: Proxy, key: str, message: bytes) -> tuple[bytes, grpc.Call]:
    with channel(proxy) as chan:
        reply, outcome = chan.unary_unary(METHOD).with_call(message, metadata=metadata(key), timeout=10)
        return reply, outcome


def trailing(outcome: grpc.Call) -> list[tuple[str, Any]]:
    return [(item.key, item.value) for item in outcome.trailing_metadata()]


def initial(outcome: grpc.Call) -> dict[str, Any]:
    return {item.key: item.value for item in outcome.initial_metadata()}


def wait_until(condition: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_lost_response_is_replayed_byte_for_byte_and_the_call_runs_once(proxy: Proxy, server: OrdersServer) -> None:
    key = str(uuid.uuid4())
    server.pause = 0.5
    lost_channel = channel(proxy)
    lost = lost_channel.unary_unary(METHOD).future(b"pizza", metadata=metadata(key))
    wait_until(lambda: server.runs == 1)
    lost_channel.close()  # the client's connection goes, its answer with it
    with pytest.raises(grpc.RpcError) as cut:
        lost.result()
    error: Any = cut.value
    assert error.code() == grpc.StatusCode.CANCELLED
    wait_until(server.finished.is_set)
    server.pause = 0.0
    first_reply, first = call(proxy, key, b"pizza")
    second_reply, second = call(proxy, key, b"pizza")
    assert server.runs == 1
    assert first_reply == second_reply == b"order 1 for pizza"
    assert trailing(first) == trailing(second) == [("x-receipt", "r-1"), ("x-receipt-bin", b"\x00\x01\xff")]
    assert initial(first)["idempotent-replayed"] == "true"
    assert first.code() == grpc.StatusCode.OK


def test_a_retry_in_flight_waits_for_the_outcome(proxy: Proxy, server: OrdersServer) -> None:
    key = str(uuid.uuid4())
    server.pause = 0.6
    with channel(proxy) as one, channel(proxy) as two:
        first = one.unary_unary(METHOD).future(b"sushi", metadata=metadata(key))
        wait_until(lambda: server.runs == 1)
        retry_reply, retry = two.unary_unary(METHOD).with_call(b"sushi", metadata=metadata(key), timeout=10)
        assert first.result() == retry_reply == b"order 1 for sushi"
    assert initial(retry)["idempotent-replayed"] == "true"
    assert server.runs == 1


def test_another_message_under_the_key_is_failed_precondition(proxy: Proxy, server: OrdersServer) -> None:
    key = str(uuid.uuid4())
    call(proxy, key, b"pizza")
    with pytest.raises(grpc.RpcError) as refused:
        call(proxy, key, b"pasta")
    error: Any = refused.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert server.runs == 1


def test_grpc_s_own_retry_policy_ends_with_the_single_outcome(server: OrdersServer, store: str) -> None:
    routes = '[[route]]\nmethod = "POST"\npath = "/shop.Orders/*"\nwait_ms = 0\n'
    proxy, directory = start_proxy(server, store, routes)
    retrying = {
        "methodConfig": [
            {
                "name": [{"service": "shop.Orders"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["ABORTED", "UNAVAILABLE"],
                },
            }
        ]
    }
    try:
        server.pause = 0.5
        # A route served before: its execution history sets the pushback (about
        # what a run still needs). A route never served yet has only the lease
        # left to go by (30 s), past the call's deadline (PROTOCOL §6.3).
        call(proxy, str(uuid.uuid4()), b"warm-up")
        key = str(uuid.uuid4())
        with channel(proxy) as plain, channel(proxy, retrying) as policy:
            # The duplicate, without a retry policy, sees the ABORTED the
            # policy's client retries on, with the pushback it waits by.
            first = plain.unary_unary(METHOD).future(b"ramen", metadata=metadata(key))
            wait_until(lambda: server.runs == 2)
            with pytest.raises(grpc.RpcError) as aborted:
                plain.unary_unary(METHOD)(b"ramen", metadata=metadata(key), timeout=10)
            error: Any = aborted.value
            assert error.code() == grpc.StatusCode.ABORTED
            pushback = {item.key: item.value for item in error.trailing_metadata()}
            assert 0 < int(pushback["grpc-retry-pushback-ms"]) <= 2_000
            retried, outcome = policy.unary_unary(METHOD).with_call(b"ramen", metadata=metadata(key), timeout=10)
            assert first.result() == retried == b"order 2 for ramen"
        assert initial(outcome)["idempotent-replayed"] == "true"
        assert server.runs == 2
    finally:
        proxy.stop()
        directory.cleanup()


def test_the_call_s_deadline_bounds_the_upstream_call(proxy: Proxy, server: OrdersServer) -> None:
    """The proxy cuts the upstream call at the call's own deadline
    (``grpc-timeout``), even on a service that ignores deadlines. The cut call
    may have run, so it is settled as the proxy's timeout — stored by default —
    and its retry is answered the same, without a second run."""
    key = str(uuid.uuid4())
    server.pause = 1.0
    with channel(proxy) as chan:
        with pytest.raises(grpc.RpcError) as cut:
            chan.unary_unary(METHOD)(b"pizza", metadata=metadata(key), timeout=0.3)
    error: Any = cut.value
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(server.finished.is_set)  # the service ran on, and finished
    server.pause = 0.0
    with pytest.raises(grpc.RpcError) as again:
        call(proxy, key, b"pizza")
    replayed: Any = again.value
    assert replayed.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "the upstream did not answer within" in replayed.details()
    assert server.runs == 1
