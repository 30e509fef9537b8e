"""When to send an attempt again, and how long to wait (PROTOCOL §14).

Every surface of this package (:class:`Client`, :class:`AsyncClient`, the requests
adapter) drives its attempts through one :class:`Attempts` value, so the rules
below live here and nowhere else. They are those of the Rust ``idemgate-client``.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

#: delay-seconds (RFC 9110 §10.2.3): ASCII digits only, no sign, no fraction.
_SECONDS = re.compile(r"[0-9]+")

#: RFC 9110 §9.2.2: repeating these has the effect of one.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})


@dataclass(frozen=True)
class RetryPolicy:
    """How many times, for what, and for how long an operation is retried. Times
    are in seconds.

    ===================  ==========  ====================================================
    setting              default
    ===================  ==========  ====================================================
    ``max_retries``      4           attempts after the first; ``0`` is exactly one attempt
    ``min_backoff``,     0.1, 5.0    exponential (×2), full jitter: each wait uniform in
    ``max_backoff``                  ``[0, bound]``
    ``max_retry_after``  10.0        a server's ``Retry-After`` is honoured up to this
    ``deadline``         30.0        all attempts and waits together; no wait that ends
                                     past it
    ``attempt_timeout``  10.0        one attempt (cut to what is left of the deadline)
    ===================  ==========  ====================================================

    Retried — a request with an ``Idempotency-Key`` or an idempotent method: a
    transport failure; ``409`` with ``Retry-After`` (the first attempt still runs);
    any ``5xx`` that is not a replay, after its ``Retry-After`` when it has one.
    Never: ``422``, other ``4xx``, a replay (``Idempotent-Replayed: true``), and a
    ``POST``/``PATCH`` without a key, which is sent exactly once.

    >>> once = RetryPolicy(max_retries=0)
    >>> patient = RetryPolicy().replace(max_retries=8, deadline=120)
    """

    max_retries: int = 4
    min_backoff: float = 0.1
    max_backoff: float = 5.0
    max_retry_after: float = 10.0
    deadline: float = 30.0
    attempt_timeout: float = 10.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"retry policy: {field.name} must be a non-negative number, not {value!r}")
        if not isinstance(self.max_retries, int):
            raise ValueError(f"retry policy: max_retries must be an integer, not {self.max_retries!r}")
        # A max_backoff below min_backoff is taken as min_backoff.
        object.__setattr__(self, "max_backoff", max(self.max_backoff, self.min_backoff))

    def replace(
        self,
        *,
        max_retries: int | None = None,
        min_backoff: float | None = None,
        max_backoff: float | None = None,
        max_retry_after: float | None = None,
        deadline: float | None = None,
        attempt_timeout: float | None = None,
    ) -> RetryPolicy:
        """This policy with the settings given changed (and checked again)."""
        return RetryPolicy(
            max_retries=self.max_retries if max_retries is None else max_retries,
            min_backoff=self.min_backoff if min_backoff is None else min_backoff,
            max_backoff=self.max_backoff if max_backoff is None else max_backoff,
            max_retry_after=self.max_retry_after if max_retry_after is None else max_retry_after,
            deadline=self.deadline if deadline is None else deadline,
            attempt_timeout=self.attempt_timeout if attempt_timeout is None else attempt_timeout,
        )


@dataclass(frozen=True)
class Verdict:
    """What an attempt's outcome asks for: the final answer, or another attempt
    (after the server's ``Retry-After`` when it gave one)."""

    retry: bool
    after: Optional[float] = None


FINAL = Verdict(retry=False)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # httpx and requests headers are case-insensitive mappings already.
    value = headers.get(name)
    return value if isinstance(value, str) else None


def is_replayed(headers: Mapping[str, str]) -> bool:
    """``Idempotent-Replayed: true``: the server's stored outcome, not a fresh run."""
    return (_header(headers, "idempotent-replayed") or "").strip().lower() == "true"


def retry_after(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds (the form idemgate sends). An HTTP-date is not
    read: the retry then waits its backoff instead."""
    value = (_header(headers, "retry-after") or "").strip()
    return float(value) if _SECONDS.fullmatch(value) else None


def judge_response(status: int, headers: Mapping[str, str]) -> Verdict:
    """The response rules of :class:`RetryPolicy`, on the status and headers only."""
    if is_replayed(headers):
        return FINAL
    after = retry_after(headers)
    if status == 409 and after is not None:
        return Verdict(retry=True, after=after)
    if 500 <= status <= 599:
        return Verdict(retry=True, after=after)
    return FINAL


class Attempts:
    """The attempts of one request: counts them, keeps the deadline, and
    remembers whether any may have run on the server."""

    def __init__(
        self,
        policy: RetryPolicy,
        method: str,
        keyed: bool,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self.retryable = keyed or method.upper() in IDEMPOTENT_METHODS
        self._clock = clock
        self._rand = rand
        self._started = clock()
        self.made = 0
        self.may_have_run = False

    def next(self) -> float:
        """Starts the next attempt; returns its timeout: the attempt timeout, cut
        to what is left of the deadline."""
        self.made += 1
        left = self.policy.deadline - (self._clock() - self._started)
        return max(0.0, min(self.policy.attempt_timeout, left))

    def answered(self, status: int, headers: Mapping[str, str]) -> Verdict:
        """After an answer: notes whether it may have run, and judges it."""
        # A 4xx is a refusal made before running, except 409: the first one runs.
        if not 400 <= status <= 499 or status == 409:
            self.may_have_run = True
        return judge_response(status, headers)

    def failed(self, delivered: bool) -> Verdict:
        """After a transport failure that may (or cannot) have delivered the
        request: always worth another attempt."""
        self.may_have_run = self.may_have_run or delivered
        return Verdict(retry=True)

    def wait_for(self, verdict: Verdict) -> float | None:
        """How long to wait before the next attempt, or ``None`` for none."""
        if not verdict.retry or not self.retryable:
            return None
        retries = self.made - 1
        if retries >= self.policy.max_retries:
            return None
        bound = min(self.policy.min_backoff * 2**retries, self.policy.max_backoff)
        backoff = self._rand() * bound  # full jitter: uniform in [0, bound]
        wait = backoff if verdict.after is None else min(verdict.after, self.policy.max_retry_after)
        # An attempt that would start at or past the deadline has no time to run.
        elapsed = self._clock() - self._started
        return wait if elapsed + wait < self.policy.deadline else None
