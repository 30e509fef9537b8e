"""The retry policy as a ``requests`` transport adapter (needs the ``requests``
extra): mount it on a ``Session`` and every request through it is retried by the
same rules as :class:`idemgate_client.Client`.

It sees requests, not operations: a request is retried when it carries an
``Idempotency-Key`` (put it there from an :class:`~idemgate_client.Operation`) or
its method is idempotent; a ``POST``/``PATCH`` without a key is sent exactly once.
Like any adapter it returns the last response, whatever its status, or raises the
last ``requests`` exception — the typed errors are the clients'.

Each attempt reads its whole answer inside the adapter, under one deadline for
the whole exchange (connect, head and body): a body cut off halfway is a lost
answer (retried under the same key), and a server that trickles its answer byte
by byte is cut off at the attempt's timeout. The answers it discards to retry
(a 409, a 503, a fresh 5xx) are closed, so their connections go back to the pool.

>>> import requests
>>> from idemgate_client import Operation
>>> from idemgate_client.requests_adapter import IdempotentAdapter
>>> session = requests.Session()
>>> session.mount("http://", IdempotentAdapter())
>>> pay = Operation()
>>> # session.post(url, json=order, headers={"Idempotency-Key": pay.key})
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ._deadline import Watchdog
from ._errors import BodyNotReplayableError

if TYPE_CHECKING:
    # What urllib3's pools hand out (its own annotations name it so).
    from urllib3._base_connection import BaseHTTPConnection
from ._policy import Attempts, RetryPolicy

__all__ = ["IdempotentAdapter"]

# The watchdog of the attempt this thread is making, for the pools to tell it
# which connection the attempt got (urllib3 takes it from the pool deep inside
# `HTTPAdapter.send`).
_current = threading.local()


def _watch(conn: BaseHTTPConnection) -> None:
    watchdog = getattr(_current, "watchdog", None)
    if watchdog is not None:
        # `sock` is set once the connection is connected (now, or for a new one, soon).
        watchdog.watch(lambda: getattr(conn, "sock", None))


class _WatchedHTTPPool(HTTPConnectionPool):
    def _get_conn(self, timeout: float | None = None) -> BaseHTTPConnection:
        conn = super()._get_conn(timeout)
        _watch(conn)
        return conn


class _WatchedHTTPSPool(HTTPSConnectionPool):
    def _get_conn(self, timeout: float | None = None) -> BaseHTTPConnection:
        conn = super()._get_conn(timeout)
        _watch(conn)
        return conn


# What a cut-off or stalled answer raises from `requests` (a body cut off halfway
# is urllib3's IncompleteRead, which requests raises as ChunkedEncodingError).
_LOST = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


class IdempotentAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` that retries per :class:`~idemgate_client.RetryPolicy`."""

    def __init__(self, policy: RetryPolicy | None = None, **options: Any) -> None:
        # urllib3's own retries stay off (the default): one policy, this one.
        super().__init__(**options)
        self.policy = policy or RetryPolicy()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        # Pools that tell the attempt's watchdog its connection.
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        attempts = Attempts(self.policy, request.method or "GET", "Idempotency-Key" in request.headers)
        if attempts.retryable and request.body is not None and not isinstance(request.body, (bytes, str)):
            raise BodyNotReplayableError()
        while True:
            outcome = self._attempt(request, attempts.next(), kwargs)
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
            if isinstance(outcome, requests.Response):
                outcome.close()  # discarded for a retry: its connection goes back to the pool
            time.sleep(wait)

    def _attempt(
        self, request: requests.PreparedRequest, timeout: float, kwargs: dict[str, Any]
    ) -> requests.Response | requests.RequestException:
        """One attempt, its answer read whole, bounded as a whole by ``timeout``
        (see :class:`~idemgate_client._deadline.Watchdog`: urllib3's read timeout
        is per read, and restarts with every trickled byte)."""
        watchdog = Watchdog(timeout)
        _current.watchdog = watchdog
        response: requests.Response | None = None
        try:
            response = super().send(request.copy(), **{**kwargs, "stream": True, "timeout": timeout})
            _ = response.content  # the whole body, here: a cut-off one is a lost answer
            return response
        except _LOST as error:
            if response is not None:
                response.close()
            if not watchdog.expired:
                return error
            timed_out = requests.ReadTimeout(f"the attempt outlived its {timeout:.3g} s deadline", request=request)
            timed_out.__cause__ = error
            return timed_out
        finally:
            _current.watchdog = None
            watchdog.finish()


def _refused(error: BaseException) -> bool:
    """A connection that was never made: requests wraps urllib3's
    ``MaxRetryError``, whose ``reason`` is a ``NewConnectionError``."""
    first = error.args[0] if error.args else None
    reason = getattr(first, "reason", first)
    return isinstance(reason, urllib3.exceptions.NewConnectionError)
