"""``IdempotentAdapter`` on a ``requests.Session`` against the real binary through
the relay: the same policy as the clients, on requests it sees by their headers."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import requests

from conftest import ORDER
from idemgate_client import BodyNotReplayableError, Operation, RetryPolicy
from idemgate_client.requests_adapter import IdempotentAdapter


def session() -> requests.Session:
    s = requests.Session()
    s.mount("http://", IdempotentAdapter(RetryPolicy(min_backoff=0.02, max_backoff=0.2)))
    return s


def test_a_keyed_post_is_retried_to_the_replay_and_an_unkeyed_one_sent_once(make_setup) -> None:
    setup = make_setup()
    url = setup.relay.url("/api/v1/orders")
    setup.relay.fault_requests("lose-response")
    keyed = session().post(url, json=ORDER, headers={**setup.headers, "Idempotency-Key": Operation().key})
    assert keyed.status_code == 201
    assert keyed.headers["idempotent-replayed"] == "true"
    assert setup.relay.stats()["requests"] == 2
    setup.relay.fault_requests("lose-response")
    with pytest.raises(requests.ConnectionError):
        session().post(url, json=ORDER, headers=setup.headers)
    assert setup.relay.stats()["requests"] == 3, "unkeyed: one attempt, answer lost"
    assert len(setup.orders()) == 2, "one per request, none twice"
    assert setup.gateway.distinct_charges == 2


def test_a_422_is_returned_not_retried_and_a_stream_refused(make_setup) -> None:
    setup = make_setup()
    url = setup.relay.url("/api/v1/orders")
    key = Operation().key
    headers = {**setup.headers, "Idempotency-Key": key}
    assert session().post(url, json=ORDER, headers=headers).status_code == 201
    reused = session().post(url, json={**ORDER, "amount": 3000}, headers=headers)
    assert reused.status_code == 422
    assert reused.json()["type"] == "/problems/key-reused"
    assert setup.relay.stats()["requests"] == 2
    with pytest.raises(BodyNotReplayableError):
        session().post(url, data=iter([b"{}"]), headers=headers)
    assert setup.relay.stats()["requests"] == 2, "refused before sending"


def test_a_body_cut_off_halfway_is_retried_with_the_same_key_to_the_replay(make_setup) -> None:
    setup = make_setup()
    url = setup.relay.url("/api/v1/orders")
    setup.relay.fault_requests("cut-body")
    response = session().post(url, json=ORDER, headers={**setup.headers, "Idempotency-Key": Operation().key})
    assert response.status_code == 201
    assert response.headers["idempotent-replayed"] == "true", "the cut-off answer's order ran; this is its replay"
    assert response.json()["order_id"] == setup.orders()[0]["order_id"]
    assert setup.relay.stats()["requests"] == 2
    assert len(setup.orders()) == 1
    assert setup.gateway.distinct_charges == 1


def test_a_trickled_answer_is_cut_at_the_attempt_timeout_and_retried(make_setup) -> None:
    setup = make_setup()
    setup.relay.fault_requests("trickle 100", 30)
    s = requests.Session()
    policy = RetryPolicy(min_backoff=0.02, max_backoff=0.2, attempt_timeout=0.5, deadline=2.0, max_retries=100)
    s.mount("http://", IdempotentAdapter(policy))
    with pytest.raises(requests.ReadTimeout):
        s.post(
            setup.relay.url("/api/v1/orders"), json=ORDER, headers={**setup.headers, "Idempotency-Key": Operation().key}
        )
    requests_seen = setup.relay.stats()["requests"]
    assert 2 <= requests_seen <= 8, f"each attempt cut at 0.5 s, retried within the 2 s deadline: {requests_seen}"
    assert len(setup.orders()) == 1, "every attempt reached the server, which ran one"
    assert setup.gateway.distinct_charges == 1


def test_a_409_in_flight_is_waited_out_on_the_same_connection_and_gets_the_replay(make_setup) -> None:
    # The gateway takes 1.5 s; a 2 s lease makes the 409's Retry-After short enough to honour here.
    setup = make_setup("--lease", "2")
    setup.gateway.delay = 1.5
    key = Operation().key
    headers = {**setup.headers, "Idempotency-Key": key}
    first: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: first.append(httpx.post(setup.server.url("/api/v1/orders"), json=ORDER, headers=headers, timeout=30))
    )
    thread.start()
    time.sleep(0.3)
    duplicate = session().post(setup.relay.url("/api/v1/orders"), json=ORDER, headers=headers)
    thread.join()
    assert first[0].status_code == 201
    assert duplicate.status_code == 201
    assert duplicate.headers["idempotent-replayed"] == "true"
    assert duplicate.content == first[0].content, "the replay is the first's answer, byte for byte"
    stats = setup.relay.stats()
    assert stats["requests"] >= 2, "a 409 first, then the replay"
    assert stats["connections"] == 1, "each discarded 409 was closed: its connection went back to the pool"
    assert len(setup.orders()) == 1
    assert len(setup.gateway.calls) == 1


def test_a_fresh_5xx_is_closed_and_retried_to_one_charge(make_setup) -> None:
    setup = make_setup()
    setup.gateway.failures.append(503)
    response = session().post(
        setup.relay.url("/api/v1/orders"), json=ORDER, headers={**setup.headers, "Idempotency-Key": Operation().key}
    )
    assert response.status_code == 201
    stats = setup.relay.stats()
    assert stats["requests"] == 2, "the 502, then the run that succeeded"
    assert stats["connections"] == 1, "the discarded 502 gave its connection back"
    assert len(setup.orders()) == 1
    assert len(setup.gateway.calls) == 2
    assert setup.gateway.distinct_charges == 1
