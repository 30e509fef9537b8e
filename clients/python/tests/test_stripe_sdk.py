"""The real Stripe Python SDK (``stripe`` from PyPI, pinned in constraints.txt)
against ``idemgate proxy`` in front of a Stripe-shaped upstream: with the
``stripe`` problem shape (per route in the proxy's TOML, or for every route with
``--problem-shape stripe``) a key reused with other parameters raises the SDK's
own ``IdempotencyError`` instead of "Invalid response object from API", a retry
with the same parameters is the replay, and the upstream charges once.

A missing ``stripe`` package fails this module's collection, so the suite fails
loudly: scripts/clients.sh installs it with the test extras."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import stripe

from conftest import binary


class StripeUpstream:
    """``POST /v1/charges`` creates a charge (a new id per call, as an API with
    no idempotency of its own would) and counts every call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        #: Seconds each charge takes.
        self.delay = 0.0
        lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                form = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
                params = dict(pair.split("=", 1) for pair in form.split("&") if pair)
                with lock:
                    upstream.calls.append(params)
                    number = len(upstream.calls)
                time.sleep(upstream.delay)
                charge = {
                    "id": f"ch_{number}",
                    "object": "charge",
                    "amount": int(params.get("amount", 0)),
                    "currency": params.get("currency"),
                }
                body = json.dumps(charge).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.send_header("request-id", f"req_{number}")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Proxy:
    """A running ``idemgate proxy`` on a fresh SQLite file."""

    def __init__(self, upstream: str, args: list[str], config: Optional[str] = None) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="idemgate-stripe-")
        command = [
            binary("idemgate"), "proxy", "--upstream", upstream,
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--idempotency-store", f"sqlite://{Path(self.dir.name) / 'proxy.db'}", *args,
        ]  # fmt: skip
        if config is not None:
            path = Path(self.dir.name) / "routes.toml"
            path.write_text(config)
            command += ["--config", str(path)]
        env = {
            "PATH": os.environ.get("PATH", ""),
            "RUST_LOG": "info",
            "NO_COLOR": "1",
            "IDEMGATE_PRINCIPAL_SECRET": "stripe-suite-secret",
        }
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                if not found and "proxy listening on http://" in line:
                    found.append(line.split("listening on http://", 1)[1].split()[0])
                    ready.set()
                elif "ERROR" in line or "WARN" in line:
                    print(f"[proxy] {line.rstrip()}")
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(30) or not found:
            self.stop()
            raise RuntimeError("idemgate proxy did not start listening within 30 s")
        self.url = f"http://{found[0]}"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.dir.cleanup()


@pytest.fixture
def upstream() -> Iterator[StripeUpstream]:
    server = StripeUpstream()
    yield server
    server.stop()


ROUTE_CONFIG = """
[[route]]
method = "POST"
path = "/v1/charges"
problem_shape = "stripe"
"""


@pytest.fixture(params=["route", "global"])
def proxy(request: pytest.FixtureRequest, upstream: StripeUpstream) -> Iterator[Proxy]:
    if request.param == "route":
        running = Proxy(upstream.url, [], ROUTE_CONFIG)
    else:
        running = Proxy(upstream.url, ["--problem-shape", "stripe"])
    yield running
    running.stop()


def client(proxy: Proxy, retries: int = 0, api_key: Optional[str] = None) -> stripe.StripeClient:
    return stripe.StripeClient(
        api_key or f"sk_test_{uuid.uuid4().hex}",
        base_addresses={"api": proxy.url},
        max_network_retries=retries,
    )


def test_a_reused_key_raises_the_sdks_idempotency_error(proxy: Proxy, upstream: StripeUpstream) -> None:
    sdk = client(proxy)
    key = str(uuid.uuid4())
    first = sdk.v1.charges.create(params={"amount": 1500, "currency": "usd"}, options={"idempotency_key": key})
    assert first.id == "ch_1"
    again = sdk.v1.charges.create(params={"amount": 1500, "currency": "usd"}, options={"idempotency_key": key})
    assert again.id == first.id, "the retry is the replay"
    assert again.last_response.headers.get("idempotent-replayed") == "true"
    # The original request's id, as Stripe replays it.
    assert first.last_response.request_id == "req_1"
    assert again.last_response.request_id == "req_1"
    with pytest.raises(stripe.IdempotencyError) as raised:
        sdk.v1.charges.create(params={"amount": 1, "currency": "usd"}, options={"idempotency_key": key})
    assert raised.value.http_status == 400
    assert raised.value.json_body["error"]["code"] == "key-reused"
    assert "different request" in str(raised.value.user_message)
    assert len(upstream.calls) == 1, "one charge upstream, whatever the SDK sent"


def test_without_the_stripe_shape_the_sdk_cannot_read_the_problem(upstream: StripeUpstream) -> None:
    running = Proxy(upstream.url, [])
    try:
        sdk = client(running)
        key = str(uuid.uuid4())
        sdk.v1.charges.create(params={"amount": 1500, "currency": "usd"}, options={"idempotency_key": key})
        with pytest.raises(stripe.APIError) as raised:
            sdk.v1.charges.create(params={"amount": 1, "currency": "usd"}, options={"idempotency_key": key})
        assert not isinstance(raised.value, stripe.IdempotencyError)
        assert raised.value.http_status == 422
        assert len(upstream.calls) == 1
    finally:
        running.stop()


def duplicate_of_a_slow_charge(proxy: Proxy) -> tuple[float, Any, str]:
    """A 3 s charge, and the same call again 0.2 s later from an SDK that retries a
    409 twice with its own backoff (0.5 s, then 0.5 to 1 s) and never reads
    ``Retry-After``: how long the duplicate took, what it got (the charge or the
    error it raised), and the first call's charge id."""
    api_key = f"sk_test_{uuid.uuid4().hex}"
    key = str(uuid.uuid4())
    params = {"amount": 1500, "currency": "usd"}
    first: list[Any] = []
    thread = threading.Thread(
        target=lambda: first.append(
            client(proxy, api_key=api_key).v1.charges.create(params=params, options={"idempotency_key": key})
        )
    )
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    try:
        outcome: Any = client(proxy, retries=2, api_key=api_key).v1.charges.create(
            params=params, options={"idempotency_key": key}
        )
    except stripe.StripeError as raised:
        outcome = raised
    elapsed = time.monotonic() - started
    thread.join()
    assert first, "the first call did not finish"
    return elapsed, outcome, first[0].id


def test_an_sdk_that_retries_409_fast_gives_up_unless_the_proxy_waits(upstream: StripeUpstream) -> None:
    upstream.delay = 3.0
    fast = Proxy(upstream.url, ["--problem-shape", "stripe", "--wait-ms", "0"])
    try:
        elapsed, outcome, _ = duplicate_of_a_slow_charge(fast)
        print(f"with --wait-ms 0: the duplicate gave up after {elapsed:.2f} s: {outcome!r}")
        assert isinstance(outcome, stripe.StripeError), outcome
        assert outcome.http_status == 409
        assert outcome.json_body["error"]["type"] == "idempotency_error"
    finally:
        fast.stop()
    # The default: a duplicate in flight waits for the outcome.
    waiting = Proxy(upstream.url, ["--problem-shape", "stripe"])
    try:
        elapsed, outcome, charge = duplicate_of_a_slow_charge(waiting)
        print(f"waiting by default: the duplicate got the charge after {elapsed:.2f} s")
        assert not isinstance(outcome, Exception), outcome
        assert outcome.id == charge, "the waiting duplicate got the first request's charge"
        assert outcome.last_response.headers.get("idempotent-replayed") == "true"
    finally:
        waiting.stop()
    assert len(upstream.calls) == 2, "one charge per proxy: the duplicates never reached the upstream"
