"""``IdempotentAdapter`` on a ``requests.Session`` against the real binary through
the relay: the same policy as the clients, on requests it sees by their headers."""

from __future__ import annotations

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
