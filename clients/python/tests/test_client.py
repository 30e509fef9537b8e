"""``Client`` and ``AsyncClient`` against the real ``idemgate serve`` binary, over
real HTTP, through the fault relay: lost responses, in-flight duplicates, changed
bodies, deadlines, a store outage's 503 — with the orders (from the server) and
the charges (the counting mock gateway) asserted after each. Every test runs on
both clients; httpx pools connections, so the relay counts requests."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any, Callable

import anyio
import httpx
import pytest

from conftest import ORDER, Setup
from idemgate_client import (
    AsyncClient,
    AttemptReport,
    BodyNotReplayableError,
    Client,
    InProgressError,
    KeyReusedError,
    Operation,
    RejectedError,
    Response,
    RetryPolicy,
    TransportError,
)

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


def test_a_lost_response_is_retried_and_replayed_with_one_order_and_one_charge(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.relay.fault_requests("lose-response")
    response = send(setup, Operation(), json=ORDER)
    assert response.status_code == 201
    assert response.replayed, "the second attempt is the first's replay"
    assert response.attempts == 2
    assert setup.relay.stats()["requests"] == 2
    orders = setup.orders()
    assert len(orders) == 1, orders
    assert response.json()["order_id"] == orders[0]["order_id"], "the replay names the first's order"
    assert len(setup.gateway.calls) == 1
    assert setup.gateway.distinct_charges == 1


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


def test_a_post_without_an_operation_is_sent_once_whatever_the_policy(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.relay.fault_requests("lose-response", 3)
    with pytest.raises(TransportError) as raised:
        send(setup, None, policy=QUICK.replace(max_retries=10), json=ORDER)
    assert raised.value.may_have_run
    assert setup.relay.stats()["requests"] == 1, "no key, no retry"
    assert len(setup.orders()) == 1, "it ran: a retry would have been a second order"
    assert setup.gateway.distinct_charges == 1


def test_the_deadline_bounds_all_attempts_and_waits(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.relay.fault_requests("delay 3000", 20)
    policy = QUICK.replace(attempt_timeout=0.3, deadline=1.0, max_retries=100)
    with pytest.raises(TransportError) as raised:
        send(setup, Operation(), policy=policy, json=ORDER)
    assert raised.value.may_have_run
    requests = setup.relay.stats()["requests"]
    assert 2 <= requests <= 6, f"each attempt cut at 0.3 s, retried within the 1 s deadline: {requests}"
    time.sleep(0.2)
    assert len(setup.orders()) == 1, "every attempt reached the server, which ran one"
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


def test_a_refused_order_is_rejected_with_its_problem_and_not_retried(make_setup, send: Send) -> None:
    setup = make_setup()
    with pytest.raises(RejectedError) as raised:
        send(setup, Operation(), json={"items": [], "currency": "RUB", "amount": 1500})
    error = raised.value
    assert error.status == 400
    assert error.problem.type == "/problems/invalid-order"
    assert error.problem.title and error.problem.detail
    assert not error.replayed and not error.may_have_run
    assert setup.relay.stats()["requests"] == 1
    assert setup.gateway.calls == []


def test_a_stream_body_is_refused_before_anything_is_sent(make_setup, send: Send) -> None:
    setup = make_setup()
    with pytest.raises(BodyNotReplayableError) as raised:
        send(setup, Operation(), content=iter([b'{"items":']), headers={"content-type": "application/json"})
    assert not raised.value.may_have_run
    assert setup.relay.stats()["connections"] == 0, "refused before the first attempt"


def test_a_trickled_answer_is_cut_at_the_attempt_timeout_and_retried(make_setup, send: Send) -> None:
    # One byte per 100 ms: each read is well inside any read timeout, and the whole
    # answer (some 300 bytes) would take half a minute. Only a deadline over the
    # whole attempt — head and body — cuts it, and then it is retried.
    setup = make_setup()
    setup.relay.fault_requests("trickle 100", 30)
    policy = QUICK.replace(attempt_timeout=0.5, deadline=2.0, max_retries=100)
    with pytest.raises(TransportError) as raised:
        send(setup, Operation(), policy=policy, json=ORDER)
    assert raised.value.may_have_run, "it was sent, and it ran"
    requests = setup.relay.stats()["requests"]
    assert 2 <= requests <= 8, f"each attempt cut at 0.5 s, retried within the 2 s deadline: {requests}"
    assert len(setup.orders()) == 1, "every attempt reached the server, which ran one"
    assert setup.gateway.distinct_charges == 1


def test_a_reset_before_the_server_saw_the_request_is_retried_to_one_order(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.relay.fault_requests("reset")
    attempts: list[AttemptReport] = []
    response = send(setup, Operation(), json=ORDER, on_attempt=attempts.append)
    assert response.status_code == 201
    assert not response.replayed, "the reset attempt never reached the server: the retry ran it"
    assert [a.status for a in attempts] == [None, 201]
    assert isinstance(attempts[0].error, httpx.TransportError)
    assert setup.relay.stats()["requests"] == 2
    assert len(setup.orders()) == 1
    assert len(setup.gateway.calls) == 1


def test_a_body_cut_off_halfway_is_a_lost_answer_retried_to_the_replay(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.relay.fault_requests("cut-body")
    response = send(setup, Operation(), json=ORDER)
    assert response.status_code == 201
    assert response.replayed, "the cut-off answer's order ran; the retry got its replay"
    assert response.attempts == 2
    assert setup.relay.stats()["requests"] == 2
    assert len(setup.orders()) == 1
    assert setup.gateway.distinct_charges == 1


def test_a_gateway_failure_is_a_fresh_5xx_retried_to_one_order_and_one_charge(make_setup, send: Send) -> None:
    setup = make_setup()
    setup.gateway.failures.append(503)
    statuses: list[int | None] = []
    response = send(setup, Operation(), json=ORDER, on_attempt=lambda a: statuses.append(a.status))
    assert response.status_code == 201
    assert statuses == [502, 201], "the server's 502 (not a replay) was retried"
    assert len(setup.orders()) == 1
    assert len(setup.gateway.calls) == 2
    assert setup.gateway.distinct_charges == 1, "both calls carried the operation's downstream key"


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
