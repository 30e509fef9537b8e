"""``Client`` and ``AsyncClient`` against the real ``idemgate serve`` binary, over
real HTTP, through the fault relay: in-flight duplicates, changed bodies, resumed
operations, a store outage's 503, a replayed 5xx, a cancelled task — with the
orders (from the server) and the charges (the counting mock gateway) asserted
after each. The scenarios one request and the relay's faults make are
``clients/scenarios.json``'s (tests/test_scenarios.py). Every test runs on both
clients; httpx pools connections, so the relay counts requests."""

from __future__ import annotations

import sqlite3
import threading
import time

import anyio
import httpx
import pytest

from conftest import ORDER, QUICK, Send, Setup
from idemgate_client import (
    AsyncClient,
    BodyNotReplayableError,
    Client,
    InProgressError,
    KeyReusedError,
    Operation,
    RejectedError,
    TransportError,
)


def test_a_duplicate_in_flight_waits_out_retry_after_and_gets_the_replay(make_setup, send: Send) -> None:
    # The gateway takes 1.5 s; a 2 s lease makes the 409's Retry-After short enough to honour here.
    setup = make_setup("--lease", "2")
    setup.gateway.delay = 1.5
    pay = Operation()
    first: list[httpx.Response] = []
    headers = {**setup.headers, "idempotency-key": pay.key}
    thread = threading.Thread(
        target=lambda: first.append(httpx.post(setup.server.url("/api/v1/orders"), json=ORDER, headers=headers, timeout=30))
    )
    thread.start()
    time.sleep(0.3)
    statuses: list[int | None] = []
    started = time.monotonic()
    duplicate = send(setup, Operation.resume(pay.key), json=ORDER, on_attempt=lambda a: statuses.append(a.status))
    waited = time.monotonic() - started
    thread.join()
    assert first[0].status_code == 201
    assert duplicate.status_code == 201 and duplicate.replayed
    assert duplicate.content == first[0].content, "the replay is the first's answer, byte for byte"
    assert statuses[0] == 409 and statuses[-1] == 201, statuses
    assert setup.relay.stats()["requests"] == duplicate.attempts
    assert waited >= 0.9, f"Retry-After (at least 1 s) was honoured, not hammered: {waited:.2f} s"
    assert len(setup.orders()) == 1
    assert len(setup.gateway.calls) == 1


def test_a_409_past_the_deadline_is_in_progress_without_waiting(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.gateway.delay = 3.0
    pay = Operation()
    headers = {**setup.headers, "idempotency-key": pay.key}
    thread = threading.Thread(
        target=lambda: httpx.post(setup.server.url("/api/v1/orders"), json=ORDER, headers=headers, timeout=30)
    )
    thread.start()
    time.sleep(0.3)
    with pytest.raises(InProgressError) as raised:
        send(setup, pay, policy=QUICK.replace(deadline=0.8), json=ORDER)
    error = raised.value
    assert error.retry_after is not None and error.retry_after >= 1, error.retry_after
    assert error.problem.type == "/problems/in-progress"
    assert error.may_have_run
    assert error.attempts == 1, "a Retry-After past the deadline is not waited for"
    assert setup.relay.stats()["requests"] == 1
    thread.join()
    assert len(setup.orders()) == 1


def test_a_changed_body_under_the_same_key_is_key_reused_and_never_retried(make_setup, send: Send) -> None:
    setup = make_setup()
    pay = Operation()
    assert send(setup, pay, json=ORDER).status_code == 201
    tampered = {"items": [{"id": 42, "quantity": 2}], "currency": "RUB", "amount": 3000}
    with pytest.raises(KeyReusedError) as raised:
        send(setup, pay, json=tampered)
    problem = raised.value.problem
    assert problem.status == 422
    assert problem.type == "/problems/key-reused"
    assert problem.title and problem.detail
    assert not raised.value.may_have_run, "this request was not run"
    assert setup.relay.stats()["requests"] == 2, "one attempt each: a 422 is final"
    assert len(setup.orders()) == 1
    assert len(setup.gateway.calls) == 1


def test_zero_retries_is_one_attempt_and_the_operation_resumes_later(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.relay.fault_requests("lose-response")
    pay = Operation()
    saved = pay.key  # what the job keeps to resume
    with pytest.raises(TransportError) as raised:
        send(setup, pay, policy=QUICK.replace(max_retries=0), json=ORDER)
    assert raised.value.may_have_run, "it was sent: it may have run (it did)"
    assert isinstance(raised.value.__cause__, httpx.TransportError)
    assert setup.relay.stats()["requests"] == 1, "max_retries=0 is one attempt"
    response = send(setup, Operation.resume(saved), json=ORDER)
    assert response.replayed, "the resumed operation gets the first outcome"
    assert len(setup.orders()) == 1
    assert setup.gateway.distinct_charges == 1


def test_a_503_from_a_locked_store_is_waited_out_then_retried(make_setup, send: Send) -> None:
    # Another process's write lock on the SQLite file: the claim outlasts the store
    # timeout, so the server answers 503 store-unavailable, Retry-After: 1, and runs nothing.
    setup = make_setup("--store-timeout-ms", "300")
    lock = sqlite3.connect(setup.server.database, isolation_level=None, check_same_thread=False)
    lock.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.7, lambda: lock.execute("COMMIT"))
    release.start()
    statuses: list[int | None] = []
    started = time.monotonic()
    try:
        response = send(setup, Operation(), json=ORDER, on_attempt=lambda a: statuses.append(a.status))
    finally:
        release.join()
        lock.close()
    waited = time.monotonic() - started
    assert response.status_code == 201
    assert not response.replayed, "the 503 ran nothing; the retry ran it"
    assert statuses == [503, 201]
    assert waited >= 1.25, f"the store timeout, then Retry-After: 1 honoured: {waited:.2f} s"
    assert len(setup.orders()) == 1
    assert setup.gateway.distinct_charges == 1


def test_a_stream_body_is_refused_before_anything_is_sent(make_setup, send: Send) -> None:
    setup = make_setup()
    with pytest.raises(BodyNotReplayableError) as raised:
        send(setup, Operation(), content=iter([b'{"items":']), headers={"content-type": "application/json"})
    assert not raised.value.may_have_run
    assert setup.relay.stats()["connections"] == 0, "refused before the first attempt"


def test_a_replayed_5xx_is_the_outcome_and_is_not_retried(failing_upstream_behind_proxy, send: Send) -> None:
    # idemgate proxy stores an upstream's 500 as the outcome and replays it
    # (PROTOCOL §8, §13): the first 500 is retried once, its replay is final.
    upstream, relay = failing_upstream_behind_proxy
    proxied = Setup(gateway=None, server=None, relay=relay, token="alice")  # type: ignore[arg-type]
    with pytest.raises(RejectedError) as raised:
        send(proxied, Operation(), content=b"{}", headers={"content-type": "application/json"})
    error = raised.value
    assert error.status == 500
    assert error.replayed, "the second answer is the stored one"
    assert error.may_have_run
    assert error.attempts == 2
    assert relay.stats()["requests"] == 2, "a fresh 500, then its replay: no third"
    assert upstream.executions == 1


def test_cancelling_the_async_task_mid_attempt_ends_the_operation_and_it_resumes(make_setup) -> None:
    setup = make_setup()
    setup.relay.fault_requests("delay 2000")
    pay = Operation()

    async def run() -> bool:
        async with AsyncClient(base_url=setup.relay.url(""), headers=setup.headers, policy=QUICK) as client:
            with anyio.move_on_after(0.5) as scope:
                await client.send(pay, "POST", "/api/v1/orders", json=ORDER)
            return scope.cancelled_caught

    assert anyio.run(run), "the attempt was still waiting for its delayed answer"
    assert setup.relay.stats()["requests"] == 1, "no attempt after the cancellation"
    time.sleep(2.0)  # the delayed answer would have come by now
    assert setup.relay.stats()["requests"] == 1, "nothing sent after the task was cancelled"
    assert len(setup.orders()) == 1, "the cancelled attempt had reached the server, which ran it"
    with Client(base_url=setup.relay.url(""), headers=setup.headers, policy=QUICK) as client:
        resumed = client.post("/api/v1/orders", operation=Operation.resume(pay.key), json=ORDER)
    assert resumed.replayed, "resumed under its key: the first outcome"
    assert len(setup.orders()) == 1
    assert setup.gateway.distinct_charges == 1


def test_a_get_with_a_body_is_refused_before_anything_is_sent(make_setup, send: Send) -> None:
    setup = make_setup()
    with pytest.raises(TypeError, match="GET request has no body"):
        send(setup, Operation(), method="GET", json=ORDER)
    with pytest.raises(TypeError, match="HEAD request has no body"):
        send(setup, None, method="head", content=b"{}")
    assert setup.relay.stats()["connections"] == 0, "refused before the first attempt"
