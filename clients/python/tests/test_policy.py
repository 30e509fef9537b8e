"""What of the retry rules and the operation handle is this package's own, without
a server: its policy's Python checks, its keys' making and hiding. The rules every
client shares are the cases of ``clients/retry-rules.json`` (tests/test_rules.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from idemgate_client import Operation, RetryPolicy


@pytest.mark.parametrize("bad", [{"deadline": float("nan")}, {"deadline": True}, {"max_retries": "3"}])
def test_the_policy_refuses_settings_that_are_not_numbers(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


def test_replace_changes_some_settings_and_checks_them() -> None:
    assert RetryPolicy().replace(max_retries=8, deadline=120) == RetryPolicy(max_retries=8, deadline=120)
    with pytest.raises(ValueError):
        RetryPolicy().replace(deadline=-1)


def test_new_operations_have_distinct_uuid4_keys() -> None:
    a, b = Operation(), Operation()
    assert a != b
    assert uuid.UUID(a.key).version == 4


def test_an_operation_never_shows_its_key() -> None:
    op = Operation.resume("secret-key-123")
    assert "secret-key-123" not in f"{op!r} {op}"
    assert op.digest in repr(op)
