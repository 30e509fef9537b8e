"""The fault scenarios every client runs against the real ``idemgate serve``
through the relay: the cases of ``clients/scenarios.json`` (its ``$comment`` says
what a case holds), which clients/js runs too, here on the sync and the async
client. tests/test_client.py keeps the scenarios that need more than one request,
a locked store or a cancelled task."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from conftest import ORDER, Send, Setup, policy_of
from idemgate_client import AttemptReport, Operation, RejectedError, TransportError

FILE: dict[str, Any] = json.loads((Path(__file__).parents[2] / "scenarios.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("scenario", FILE["scenarios"], ids=[scenario["name"] for scenario in FILE["scenarios"]])
def test_scenario(scenario: dict[str, Any], make_setup: Callable[..., Setup], send: Send) -> None:
    setup = make_setup()
    for words, count in scenario.get("faults", []):
        setup.relay.fault_requests(words, count)
    setup.gateway.failures.extend(scenario.get("gateway_failures", []))
    reports: list[AttemptReport] = []
    expect = scenario["expect"]

    def sent() -> Any:
        return send(
            setup,
            Operation() if scenario.get("operation", True) else None,
            policy=policy_of({**FILE["base_policy"], **scenario.get("policy", {})}),
            json=scenario.get("body", ORDER),
            on_attempt=reports.append,
        )

    started = time.monotonic()
    if "error" not in expect:
        response = sent()
        assert response.status_code == expect["status"]
        if "replayed" in expect:
            assert response.replayed == expect["replayed"]
        if "attempts" in expect:
            assert response.attempts == expect["attempts"]
    else:
        with pytest.raises(TransportError if expect["error"] == "transport" else RejectedError) as raised:
            sent()
        error = raised.value
        if isinstance(error, RejectedError):
            assert error.status == expect["status"]
            assert error.problem.type == expect["problem_type"]
            assert error.problem.title and error.problem.detail, error.problem
            assert error.replayed == expect["replayed"]
        assert error.may_have_run == expect["may_have_run"]
    elapsed_ms = (time.monotonic() - started) * 1000
    if "elapsed_below_ms" in expect:
        assert elapsed_ms < expect["elapsed_below_ms"], f"took {elapsed_ms:.0f} ms"
    for report in reports:
        if report.status is None:
            # No answer: httpx's failure, or the attempt's own deadline (the async
            # client's anyio.fail_after).
            assert isinstance(report.error, (httpx.TransportError, TimeoutError)), report
    if "statuses" in expect:
        assert [report.status for report in reports] == expect["statuses"]
    requests = setup.relay.stats()["requests"]
    if "relay_requests" in expect:
        assert requests == expect["relay_requests"], "attempts that reached the relay"
    if "relay_requests_between" in expect:
        low, high = expect["relay_requests_between"]
        assert low <= requests <= high, f"attempts that reached the relay: {requests}"
    time.sleep(scenario.get("settle_ms", 0) / 1000)
    if "orders" in expect:
        assert len(setup.orders()) == expect["orders"]
    if "gateway_calls" in expect:
        assert len(setup.gateway.calls) == expect["gateway_calls"]
    if "distinct_charges" in expect:
        assert setup.gateway.distinct_charges == expect["distinct_charges"]
