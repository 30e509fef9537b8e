"""The real things the suite drives: the ``idemgate`` binary (``serve``), the
``idemgate-relay`` fault relay of idemgate-testkit between the client and the
server, and a counting mock payment gateway (the one external party, so the one
mock). Every process is the test's own, on a free loopback port, and is killed
when the test ends."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import anyio
import httpx
import pytest

from idemgate_client import AsyncClient, Client, Operation, Response, RetryPolicy

REPO = Path(__file__).resolve().parents[3]

#: The order every test places unless it says otherwise.
ORDER = {"items": [{"id": 42, "quantity": 1}], "currency": "RUB", "amount": 1500}


def _target_dir() -> Path:
    configured = os.environ.get("CARGO_TARGET_DIR")
    return Path(configured).resolve() if configured else REPO / "target"


def binary(name: str) -> str:
    """A binary of the workspace: ``IDEMGATE_BIN`` for the server (the README's
    test command sets it), ``IDEMGATE_RELAY_BIN`` or the relay beside
    ``IDEMGATE_BIN`` for the relay; without them
    ``${CARGO_TARGET_DIR:-target}/release/…``, which :func:`pytest_sessionstart`
    builds before any test runs (a test never runs cargo)."""
    server = os.environ.get("IDEMGATE_BIN")
    if name == "idemgate":
        chosen = server
    else:
        chosen = os.environ.get("IDEMGATE_RELAY_BIN") or (str(Path(server).parent / name) if server else None)
    if chosen is None:
        chosen = str(_target_dir() / "release" / name)
    if not Path(chosen).exists():
        raise RuntimeError(
            f"{chosen} does not exist: set IDEMGATE_BIN (and IDEMGATE_RELAY_BIN) to built binaries, "
            "or unset them to have the session build target/release"
        )
    return chosen


def pytest_sessionstart(session: pytest.Session) -> None:
    """Without ``IDEMGATE_BIN``, builds the missing release binaries once, before
    the first test; with it, checks that both binaries exist."""
    if os.environ.get("IDEMGATE_BIN") is None:
        for package, name in (("idemgate-server", "idemgate"), ("idemgate-testkit", "idemgate-relay")):
            if not (_target_dir() / "release" / name).exists():
                print(f"{_target_dir() / 'release' / name} is missing: cargo build --release -p {package} --bin {name}")
                subprocess.run(["cargo", "build", "--release", "-p", package, "--bin", name], cwd=REPO, check=True)
    binary("idemgate")
    binary("idemgate-relay")


@dataclass
class Charge:
    key: Optional[str]
    body: Any


@dataclass
class MockGateway:
    """``POST /charges`` approves (deduplicated by its ``Idempotency-Key``, as a
    real gateway does) after ``delay`` seconds, and counts every call; a status
    put in ``failures`` charges and then answers that status anyway (the worst
    case)."""

    server: ThreadingHTTPServer
    calls: list[Charge] = field(default_factory=list)
    charges: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    failures: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def distinct_charges(self) -> int:
        return len(self.charges)


@pytest.fixture
def gateway() -> Iterator[MockGateway]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            key = self.headers.get("idempotency-key")
            with lock:
                mock.calls.append(Charge(key, body))
                charge = mock.charges.setdefault(key or f"no-key-{uuid.uuid4()}", f"ch_{len(mock.charges) + 1}")
                failure = mock.failures.pop(0) if mock.failures else None
            time.sleep(mock.delay)
            if failure is not None:
                self.send_response(failure)
                self.send_header("content-length", "15")
                self.end_headers()
                self.wfile.write(b"gateway trouble")
                return
            answer = json.dumps({"id": charge, "status": "succeeded"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    mock = MockGateway(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield mock
    server.shutdown()
    server.server_close()


def _spawn_listening(command: list[str], marker: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """Starts ``command``; returns it and the address its stderr names after
    ``marker`` (``… listening on http://ADDR``)."""
    env = {"PATH": os.environ.get("PATH", ""), "RUST_LOG": "info", "NO_COLOR": "1", **env}
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if not found and marker in line:
                found.append(line.split(marker, 1)[1].split()[0])
                ready.set()
            elif "ERROR" in line or "WARN" in line:
                print(f"[{command[1]}] {line.rstrip()}")
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(30) or not found:
        process.kill()
        process.wait()
        raise RuntimeError(f"idemgate {command[1]} did not start listening within 30 s")
    return process, found[0]


class Server:
    """A running ``idemgate serve`` on a fresh SQLite file."""

    def __init__(self, gateway: MockGateway, args: list[str]) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="idemgate-py-")
        self.database = Path(self.dir.name) / "orders.db"
        command = [
            binary("idemgate"), "serve", "--listen", "127.0.0.1:0",
            "--database", f"sqlite://{self.database}", "--wait-ms", "0",
            "--gateway-url", gateway.url, *args,
        ]  # fmt: skip
        try:
            self.process, self.addr = _spawn_listening(command, "listening on http://", {})
        except BaseException:
            self.dir.cleanup()
            raise

    def url(self, path: str) -> str:
        return f"http://{self.addr}{path}"

    def orders(self, token: str) -> list[dict[str, Any]]:
        """The orders of ``token``, straight from the server (not through the relay)."""
        response = httpx.get(self.url("/api/v1/orders"), headers={"authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
        orders: list[dict[str, Any]] = response.json()["orders"]
        return orders

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.dir.cleanup()


class Relay:
    """The ``idemgate-relay`` process in front of a server, driven over its
    standard input (it exits when that closes)."""

    def __init__(self, upstream: str) -> None:
        self.process = subprocess.Popen(
            [binary("idemgate-relay"), upstream], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        first = json.loads(self._line())
        self.addr: str = first["listening"]

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("idemgate-relay exited")
        return line

    def command(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._line())
        if "error" in answer:
            raise RuntimeError(f"idemgate-relay refused {line!r}: {answer['error']}")
        return answer

    def fault_requests(self, fault: str, count: int = 1) -> None:
        """The next ``count`` requests, on any connection, get ``fault``
        (``lose-response``, ``reset``, ``delay MS``)."""
        for _ in range(count):
            self.command(f"request {fault}")

    def stats(self) -> dict[str, int]:
        return self.command("stats")

    def url(self, path: str) -> str:
        return f"http://{self.addr}{path}"

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Proxy:
    """``idemgate proxy`` in front of ``upstream``, on ``store`` (memory unless
    told), with the route file ``config`` when one is given."""

    def __init__(self, upstream: str, config: str | None = None, store: str = "memory") -> None:
        command = [
            binary("idemgate"), "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0", "--idempotency-store", store,
        ]  # fmt: skip
        if config is not None:
            command += ["--config", config]
        secret = {"IDEMGATE_PRINCIPAL_SECRET": "python-client-suite-secret"}
        self.process, self.addr = _spawn_listening(command, "proxy listening on http://", secret)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@dataclass
class Upstream:
    """An HTTP service behind the proxy that answers every request ``status``
    and counts the requests it ran."""

    server: ThreadingHTTPServer
    status: int = 500
    executions: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def failing_upstream_behind_proxy() -> Iterator[tuple[Upstream, Relay]]:
    """An upstream that answers 500 (``executions`` counted), ``idemgate proxy``
    in front of it, and the relay in front of that."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", 0)))
            with lock:
                upstream.executions += 1
            body = b"upstream broke"
            self.send_response(upstream.status)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    upstream = Upstream(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = Proxy(upstream.url)
    relay = Relay(proxy.addr)
    yield upstream, relay
    relay.stop()
    proxy.stop()
    server.shutdown()
    server.server_close()


@dataclass
class Setup:
    gateway: MockGateway
    server: Server
    relay: Relay
    token: str = field(default_factory=lambda: f"token-{uuid.uuid4()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def orders(self) -> list[dict[str, Any]]:
        return self.server.orders(self.token)


@pytest.fixture
def make_setup(gateway: MockGateway) -> Iterator[Any]:
    """``make_setup(*serve_flags)``: the gateway, the server, a relay in front."""
    started: list[tuple[Server, Relay]] = []

    def make(*args: str) -> Setup:
        server = Server(gateway, list(args))
        relay = Relay(server.addr)
        started.append((server, relay))
        return Setup(gateway, server, relay)

    yield make
    for server, relay in started:
        relay.stop()
        server.stop()


#: Short waits, so the suite stays fast; the rules are the defaults'.
QUICK = RetryPolicy(min_backoff=0.02, max_backoff=0.2)

Send = Callable[..., Response]


@pytest.fixture(params=["sync", "async"])
def send(request: pytest.FixtureRequest) -> Send:
    """``send(setup, operation, policy=…, **request)`` through the relay, on a fresh
    client of the parametrized kind."""

    def sync(setup: Setup, operation: Operation | None, policy: RetryPolicy = QUICK, **options: Any) -> Response:
        with Client(base_url=setup.relay.url(""), headers=setup.headers, policy=policy) as client:
            return client.send(operation, options.pop("method", "POST"), "/api/v1/orders", **options)

    def asynchronous(
        setup: Setup, operation: Operation | None, policy: RetryPolicy = QUICK, **options: Any
    ) -> Response:
        async def run() -> Response:
            async with AsyncClient(base_url=setup.relay.url(""), headers=setup.headers, policy=policy) as client:
                return await client.send(operation, options.pop("method", "POST"), "/api/v1/orders", **options)

        return anyio.run(run)

    return sync if request.param == "sync" else asynchronous


def policy_of(settings: dict[str, Any]) -> RetryPolicy:
    """The retry-policy settings of the shared case files (``clients/retry-rules.json``,
    ``clients/scenarios.json``: times in milliseconds) as a policy (times in
    seconds), checked by ``RetryPolicy`` itself."""
    changes: dict[str, Any] = {}
    for name, value in settings.items():
        if name.endswith("_ms"):
            changes[name[: -len("_ms")]] = value / 1000
        else:
            changes[name] = value
    return RetryPolicy(**changes)
