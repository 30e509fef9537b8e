"""The retry rules every client of this repository runs: the cases of
``clients/retry-rules.json`` (its ``$comment`` says what each section holds), which
the Rust ``idemgate-client`` and clients/js load too. A rule or a case goes there,
not here; tests/test_policy.py keeps what is this package's own."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest

from conftest import policy_of
from idemgate_client import InProgressError, InvalidKeyError, KeyReusedError, Operation, RejectedError, RetryPolicy
from idemgate_client._client import _error_from_answer
from idemgate_client._policy import Attempts, Verdict, judge_response, retry_after

RULES: dict[str, Any] = json.loads((Path(__file__).parents[2] / "retry-rules.json").read_text(encoding="utf-8"))

TRANSPORT_FAILURE = Verdict(retry=True)


def seconds(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else ms / 1000


def attempts_made(
    settings: dict[str, Any], method: str = "POST", keyed: bool = True, made: int = 1, draw: float | None = None
) -> Attempts:
    """``made`` attempts under ``settings``, each backoff drawn at ``draw``'s point
    of its range (a random one without it)."""
    rand = random.random if draw is None else (lambda: draw)
    attempts = Attempts(policy_of(settings), method, keyed, rand=rand)
    for _ in range(made):
        attempts.next()
    return attempts


def cases(section: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return pytest.mark.parametrize("case", RULES[section], ids=lambda case: json.dumps(case, ensure_ascii=False)[:80])


def test_the_default_policy() -> None:
    assert policy_of(RULES["defaults"]) == RetryPolicy()
    assert {f"{name}_ms" if name != "max_retries" else name for name in RetryPolicy.__dataclass_fields__} == set(
        RULES["defaults"]
    )


@cases("responses")
def test_responses(case: dict[str, Any]) -> None:
    expected = Verdict(True, seconds(case["after_ms"])) if case["retry"] else Verdict(False)
    assert judge_response(case["status"], httpx.Headers(case["headers"])) == expected


@cases("retry_after")
def test_retry_after_values(case: dict[str, Any]) -> None:
    assert retry_after(httpx.Headers({"retry-after": case["value"]})) == seconds(case["ms"])


@cases("retryable")
def test_retryable_requests(case: dict[str, Any]) -> None:
    attempts = attempts_made({}, case["method"], case["keyed"])
    assert (attempts.wait_for(TRANSPORT_FAILURE) is not None) == case["retried"]


@cases("may_have_run")
def test_which_answers_may_have_run(case: dict[str, Any]) -> None:
    attempts = attempts_made({})
    attempts.answered(case["status"], httpx.Headers())
    assert attempts.may_have_run == case["may_have_run"]


@cases("waits")
def test_waits(case: dict[str, Any]) -> None:
    answer = case["answer"]
    verdict = (
        TRANSPORT_FAILURE if answer is None else judge_response(answer["status"], httpx.Headers(answer["headers"]))
    )

    def wait_at(rand: float) -> float | None:
        made = attempts_made(case["policy"], case.get("method", "POST"), case.get("keyed", True), case["attempts"], rand)
        return made.wait_for(verdict)

    if "backoff_up_to_ms" in case:
        # Full jitter: the top of the range is the bound, its bottom no wait.
        assert wait_at(1.0) == pytest.approx(case["backoff_up_to_ms"] / 1000)
        assert wait_at(0.0) == 0
    else:
        expected = seconds(case["wait_ms"])
        assert wait_at(0.5) == (None if expected is None else pytest.approx(expected))


@cases("jitter")
def test_full_jitter_spreads_the_waits_from_zero(case: dict[str, Any]) -> None:
    attempts = attempts_made(case["policy"])
    waits = [attempts.wait_for(TRANSPORT_FAILURE) for _ in range(case["draws"])]
    drawn = [w for w in waits if w is not None]
    assert len(drawn) == len(waits)
    assert any(w < case["some_below_ms"] / 1000 for w in drawn)
    assert any(w > case["some_above_ms"] / 1000 for w in drawn)


@cases("timeouts")
def test_each_attempt_gets_at_most_what_is_left_of_the_deadline(case: dict[str, Any]) -> None:
    assert Attempts(policy_of(case["policy"]), "POST", True).next() <= case["at_most_ms"] / 1000


@cases("policies")
def test_policies(case: dict[str, Any]) -> None:
    if case.get("valid", True):
        assert policy_of(case["settings"]).max_backoff == pytest.approx(case["max_backoff_ms"] / 1000)
    else:
        with pytest.raises(ValueError):
            policy_of(case["settings"])


@cases("keys")
def test_keys(case: dict[str, Any]) -> None:
    key = case["key"] * case.get("repeat", 1)
    if not case["valid"]:
        with pytest.raises(InvalidKeyError):
            Operation.resume(key)
        return
    operation = Operation.resume(key)
    assert operation.key == key
    if "digest" in case:
        assert operation.digest == case["digest"]


@cases("answers")
def test_answers(case: dict[str, Any]) -> None:
    response = httpx.Response(case["status"], headers=case["headers"], content=case["body"].encode())
    error = _error_from_answer(response, case["ran_before"], 1)
    if case["error"] == "key-reused":
        assert isinstance(error, KeyReusedError)
    elif case["error"] == "in-progress":
        assert isinstance(error, InProgressError)
        assert error.retry_after == seconds(case["retry_after_ms"])
    else:
        assert isinstance(error, RejectedError)
        assert error.replayed == case["replayed"]
    assert error.may_have_run == case["may_have_run"]
    assert isinstance(error, (KeyReusedError, InProgressError, RejectedError))
    problem = error.problem
    assert {"type": problem.type, "title": problem.title, "detail": problem.detail} == case["problem"]
