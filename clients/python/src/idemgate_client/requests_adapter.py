"""The retry policy as a ``requests`` transport adapter (needs the ``requests``
extra): mount it on a ``Session`` and every request through it is retried by the
same rules as :class:`idemgate_client.Client`.

It sees requests, not operations: a request is retried when it carries an
``Idempotency-Key`` (put it there from an :class:`~idemgate_client.Operation`) or
its method is idempotent; a ``POST``/``PATCH`` without a key is sent exactly once.
Like any adapter it returns the last response, whatever its status, or raises the
last ``requests`` exception — the typed errors are the clients'.

>>> import requests
>>> from idemgate_client import Operation
>>> from idemgate_client.requests_adapter import IdempotentAdapter
>>> session = requests.Session()
>>> session.mount("http://", IdempotentAdapter())
>>> pay = Operation()
>>> # session.post(url, json=order, headers={"Idempotency-Key": pay.key})
"""

from __future__ import annotations

import time
from typing import Any

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter

from ._errors import BodyNotReplayableError
from ._policy import Attempts, RetryPolicy

__all__ = ["IdempotentAdapter"]


class IdempotentAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` that retries per :class:`~idemgate_client.RetryPolicy`."""

    def __init__(self, policy: RetryPolicy | None = None, **options: Any) -> None:
        # urllib3's own retries stay off (the default): one policy, this one.
        super().__init__(**options)
        self.policy = policy or RetryPolicy()

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        attempts = Attempts(self.policy, request.method or "GET", "Idempotency-Key" in request.headers)
        if attempts.retryable and request.body is not None and not isinstance(request.body, (bytes, str)):
            raise BodyNotReplayableError()
        kwargs["stream"] = False  # read each answer whole: a cut-off body is a lost answer
        while True:
            kwargs["timeout"] = attempts.next()
            outcome: requests.Response | requests.RequestException
            try:
                outcome = super().send(request.copy(), **kwargs)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as error:
                outcome = error
            if isinstance(outcome, requests.Response):
                verdict = attempts.answered(outcome.status_code, outcome.headers)
            else:
                not_connected = isinstance(outcome, requests.ConnectTimeout) or _refused(outcome)
                verdict = attempts.failed(not not_connected)
            wait = attempts.wait_for(verdict)
            if wait is None:
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome
            time.sleep(wait)


def _refused(error: BaseException) -> bool:
    """A connection that was never made: requests wraps urllib3's
    ``MaxRetryError``, whose ``reason`` is a ``NewConnectionError``."""
    first = error.args[0] if error.args else None
    reason = getattr(first, "reason", first)
    return isinstance(reason, urllib3.exceptions.NewConnectionError)
