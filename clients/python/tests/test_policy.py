"""The retry rules and the operation handle, without a server: the same cases as
the Rust client's unit tests, so the clients cannot drift apart unnoticed."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from idemgate_client import InvalidKeyError, Operation, RetryPolicy
from idemgate_client._errors import Problem
from idemgate_client._policy import Attempts, Verdict, judge_response, retry_after

RETRY = Verdict(retry=True)
NONE: dict[str, str] = {}
AFTER_2 = {"retry-after": "2"}
REPLAYED = {"idempotent-replayed": "true"}


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (409, AFTER_2, Verdict(True, 2.0)),
        (409, NONE, Verdict(False)),  # an application's own conflict
        (503, AFTER_2, Verdict(True, 2.0)),
        (503, NONE, Verdict(True)),
        (500, NONE, Verdict(True)),
        (502, NONE, Verdict(True)),
        (502, REPLAYED, Verdict(False)),
        (500, REPLAYED, Verdict(False)),
        (422, NONE, Verdict(False)),
        (400, NONE, Verdict(False)),
        (401, NONE, Verdict(False)),
        (429, AFTER_2, Verdict(False)),
        (201, NONE, Verdict(False)),
        (201, REPLAYED, Verdict(False)),
    ],
)
def test_the_documented_response_rules(status: int, headers: dict[str, str], expected: Verdict) -> None:
    assert judge_response(status, headers) == expected


def test_retry_after_is_read_in_seconds_only() -> None:
    assert retry_after({"retry-after": " 7 "}) == 7.0
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after({"retry-after": "-1"}) is None
    assert retry_after({"retry-after": "1.5"}) is None


def first_attempt(policy: RetryPolicy = RetryPolicy(), method: str = "POST", keyed: bool = True, **clock) -> Attempts:
    attempts = Attempts(policy, method, keyed, **clock)
    attempts.next()
    return attempts


def test_zero_retries_means_one_attempt() -> None:
    assert first_attempt(RetryPolicy(max_retries=0)).wait_for(RETRY) is None


def test_an_unkeyed_post_or_patch_is_never_retried_but_a_keyed_one_and_a_get_are() -> None:
    assert first_attempt(keyed=False).wait_for(RETRY) is None
    assert first_attempt(method="patch", keyed=False).wait_for(RETRY) is None
    assert first_attempt().wait_for(RETRY) is not None
    assert first_attempt(method="GET", keyed=False).wait_for(RETRY) is not None


def test_backoff_is_bounded_by_full_jitter_and_retry_after_by_its_cap() -> None:
    policy = RetryPolicy(min_backoff=0.1, max_backoff=0.4, max_retry_after=3, max_retries=100)
    attempts = first_attempt(policy, rand=lambda: 1.0)  # the top of each range
    for retry in range(8):
        assert attempts.wait_for(RETRY) == pytest.approx(min(0.1 * 2**retry, 0.4)), retry
        attempts.next()
    assert attempts.wait_for(Verdict(True, 29.0)) == 3


def test_full_jitter_spreads_the_waits_from_zero() -> None:
    attempts = first_attempt(RetryPolicy(min_backoff=1, max_backoff=1))
    waits = [attempts.wait_for(RETRY) for _ in range(200)]
    assert all(w is not None and 0 <= w <= 1 for w in waits)
    assert any(w < 0.25 for w in waits) and any(w > 0.75 for w in waits)  # type: ignore[operator]


def test_no_wait_that_ends_past_the_deadline_and_each_attempt_gets_what_is_left() -> None:
    attempts = first_attempt(RetryPolicy(deadline=2))
    assert attempts.wait_for(Verdict(True, 5.0)) is None
    assert attempts.wait_for(Verdict(True, 1.0)) == 1.0
    assert Attempts(RetryPolicy(deadline=0.3, attempt_timeout=10), "POST", True).next() <= 0.3


def test_the_policy_refuses_settings_that_are_not_non_negative_numbers() -> None:
    for bad in ({"max_retries": -1}, {"deadline": float("nan")}, {"max_retries": 1.5}, {"deadline": True}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)  # type: ignore[arg-type]
    assert RetryPolicy(min_backoff=0.5, max_backoff=0.1).max_backoff == 0.5


def test_new_operations_have_distinct_uuid4_keys() -> None:
    a, b = Operation(), Operation()
    assert a != b
    assert uuid.UUID(a.key).version == 4


def test_resume_keeps_the_key_and_refuses_what_the_server_would() -> None:
    assert Operation.resume("order-42").key == "order-42"
    for bad in ["", "a,b", '"quoted"', " padded", "has space", "ключ", "k" * 256, "tab\there"]:
        with pytest.raises(InvalidKeyError):
            Operation.resume(bad)


def test_an_operation_never_shows_its_key_and_its_digest_is_the_servers() -> None:
    op = Operation.resume("secret-key-123")
    assert "secret-key-123" not in f"{op!r} {op}"
    assert op.digest == "sha256:" + hashlib.sha256(b"secret-key-123").hexdigest()[:12]


def test_a_plain_text_answer_is_about_blank_and_the_type_decides() -> None:
    problem = Problem.read(502, "text/plain", b"oops")
    assert (problem.type, problem.title, problem.detail) == ("about:blank", "Bad Gateway", None)
    other = Problem.read(422, "application/problem+json", b'{"type":"https://example.com/x","title":"Key reused"}')
    assert not other.is_idemgate("key-reused")
