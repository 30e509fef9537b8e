"""The clients: operations over ``httpx`` (sync and async), retried by the
:class:`RetryPolicy`, ending in a :class:`Response` or an :class:`IdemgateError`."""

from __future__ import annotations

import json as jsonlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

import anyio
import httpx

from ._deadline import Watchdog
from ._errors import (
    BodyNotReplayableError,
    IdemgateError,
    InProgressError,
    KeyReusedError,
    Problem,
    RejectedError,
    TransportError,
)
from ._operation import Operation
from ._policy import Attempts, RetryPolicy, Verdict, is_replayed, retry_after

#: A body sent the same, byte for byte, on every attempt.
Content = Union[bytes, bytearray, memoryview, str]


@dataclass(frozen=True)
class AttemptReport:
    """How one attempt ended, as ``on_attempt`` hears it."""

    #: 1 for the first attempt.
    attempt: int
    #: The answer's status, or ``None`` when there was no answer.
    status: Optional[int]
    #: The answer was a replay of the stored outcome.
    replayed: bool
    #: The transport failure, when there was no answer.
    error: Optional[BaseException]
    #: The wait before the next attempt in seconds, or ``None`` when this was the last.
    retry_in: Optional[float]


OnAttempt = Callable[[AttemptReport], None]


class Response:
    """The successful (``2xx``/``3xx``) outcome of an operation, read whole."""

    def __init__(self, http: httpx.Response, attempts: int) -> None:
        #: The last attempt's ``httpx.Response``.
        self.http = http
        #: How many attempts it took (1 when the first was answered).
        self.attempts = attempts

    @property
    def status_code(self) -> int:
        return self.http.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self.http.headers

    @property
    def content(self) -> bytes:
        """The body bytes."""
        return self.http.content

    @property
    def replayed(self) -> bool:
        """The server replayed a stored outcome (``Idempotent-Replayed: true``)
        rather than running the operation for this attempt: true after a lost
        response was retried, or after a wait on a running duplicate."""
        return is_replayed(self.http.headers)

    def json(self) -> Any:
        """The body as JSON."""
        return self.http.json()

    def __repr__(self) -> str:
        return f"<Response [{self.status_code}] replayed={self.replayed} attempts={self.attempts}>"


# Failures that made no connection, so no byte of the request left: the only
# transport failures known not to have run.
_NOT_CONNECTED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _prepare(
    http: httpx.Client | httpx.AsyncClient,
    operation: Operation | None,
    method: str,
    url: httpx.URL | str,
    *,
    content: Any,
    json: Any,
    headers: Mapping[str, str] | None,
    params: Any,
    policy: RetryPolicy,
) -> tuple[httpx.Request, Attempts]:
    """The request every attempt sends (its body fixed once), and its attempts."""
    if method.upper() in ("GET", "HEAD") and (content is not None or json is not None):
        # Servers and proxies ignore or refuse such a body, and the key's
        # fingerprint would cover bytes the server never reads: the caller's
        # mistake, said before any attempt.
        raise TypeError(f"a {method.upper()} request has no body: send it as POST, or put it in the URL")
    merged = httpx.Headers(headers)
    if operation is not None:
        merged["idempotency-key"] = operation.key
    attempts = Attempts(policy, method, "idempotency-key" in merged)
    if json is not None:
        if content is not None:
            raise TypeError("give a request either content or json, not both")
        content = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        merged.setdefault("content-type", "application/json")
    elif isinstance(content, str):
        content = content.encode("utf-8")
    elif isinstance(content, (bytearray, memoryview)):
        content = bytes(content)  # a copy: the caller may reuse its buffer
    elif content is not None and not isinstance(content, bytes) and attempts.retryable:
        # An iterator, a generator or a file is read once.
        raise BodyNotReplayableError()
    request = http.build_request(method, url, content=content, headers=merged, params=params)
    return request, attempts


def _judge(
    attempts: Attempts,
    outcome: httpx.Response | Exception,
    on_attempt: OnAttempt | None,
) -> float | None:
    """Notes an attempt's outcome; returns the wait before the next, or ``None``."""
    status: int | None = None
    replayed = False
    error: Exception | None = None
    if isinstance(outcome, Exception):
        verdict: Verdict = attempts.failed(not isinstance(outcome, _NOT_CONNECTED))
        error = outcome
    else:
        verdict = attempts.answered(outcome.status_code, outcome.headers)
        status, replayed = outcome.status_code, is_replayed(outcome.headers)
    wait = attempts.wait_for(verdict)
    if on_attempt is not None:
        on_attempt(AttemptReport(attempt=attempts.made, status=status, replayed=replayed, error=error, retry_in=wait))
    return wait


def _finish(attempts: Attempts, outcome: httpx.Response | Exception) -> Response:
    """The last attempt's outcome, as the operation's: a response or an error."""
    if isinstance(outcome, Exception):
        raise TransportError(may_have_run=attempts.may_have_run, attempts=attempts.made) from outcome
    if outcome.status_code >= 400:
        raise _error_from_answer(outcome, attempts.may_have_run, attempts.made)
    return Response(outcome, attempts.made)


def _error_from_answer(response: httpx.Response, may_have_run: bool, attempts: int) -> IdemgateError:
    """The error for a final, unsuccessful answer, after ``attempts`` attempts of
    which any ``may_have_run``."""
    status = response.status_code
    problem = Problem.read(status, response.headers.get("content-type", ""), response.content)
    after = retry_after(response.headers)
    if status == 422 and problem.is_idemgate("key-reused"):
        return KeyReusedError(problem, attempts)
    if status == 409 and (problem.is_idemgate("in-progress") or after is not None):
        return InProgressError(problem, after, attempts)
    return RejectedError(
        problem,
        replayed=is_replayed(response.headers),
        may_have_run=may_have_run or status >= 500,
        attempts=attempts,
    )


def _with_timeout(request: httpx.Request, seconds: float) -> None:
    request.extensions["timeout"] = httpx.Timeout(seconds).as_dict()


def _watch_stream(watchdog: Watchdog, stream: Any) -> None:
    """Tells ``watchdog`` the socket under an httpcore network stream, if any."""
    get = getattr(stream, "get_extra_info", None)
    if get is not None:
        watchdog.watch(get("socket"))


def _tracer(watchdog: Watchdog) -> Callable[[str, Any], None]:
    """httpcore's ``trace`` extension, telling ``watchdog`` the socket of each new
    connection as soon as it is made: the attempt is bounded while it waits for
    the head, not only for the body."""

    def trace(event: str, info: Any) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            _watch_stream(watchdog, info.get("return_value"))

    return trace


class Client:
    """Sends requests with ``httpx.Client``, retrying the ones it safely can (see
    :class:`RetryPolicy`).

    Give it your ``httpx.Client`` (its event hooks, auth and transports run on
    every attempt), or the keyword arguments to make one it owns and closes.

    >>> client = Client(base_url="http://127.0.0.1:8080", headers={"authorization": "Bearer alice"})
    >>> client.close()
    """

    def __init__(self, http: httpx.Client | None = None, *, policy: RetryPolicy | None = None, **httpx_options: Any) -> None:
        if http is not None and httpx_options:
            raise TypeError("give either an httpx.Client or the options to make one, not both")
        self._owned = http is None
        self.http = http if http is not None else httpx.Client(**httpx_options)
        self.policy = policy or RetryPolicy()

    def send(
        self,
        operation: Operation | None,
        method: str,
        url: httpx.URL | str,
        *,
        content: Content | Any = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Any = None,
        policy: RetryPolicy | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> Response:
        """Sends a request as an attempt of ``operation`` — with its key, retried —
        or, with ``None``, as a plain request (retried only when its method is
        idempotent). Each attempt reads the whole body, so a response cut off
        halfway is retried like any lost response.

        :raises KeyReusedError, InProgressError, RejectedError, TransportError, BodyNotReplayableError:
            each an :class:`IdemgateError` with ``may_have_run``.
        """
        request, attempts = _prepare(
            self.http, operation, method, url, content=content, json=json,
            headers=headers, params=params, policy=policy or self.policy,
        )
        while True:
            outcome = self._attempt(request, attempts.next())
            wait = _judge(attempts, outcome, on_attempt)
            if wait is None:
                return _finish(attempts, outcome)
            time.sleep(wait)

    def _attempt(self, request: httpx.Request, timeout: float) -> httpx.Response | Exception:
        """One attempt, bounded as a whole by ``timeout``: connect, head and body.

        httpx's timeouts are per operation (a read timeout restarts with every
        byte), so a server that trickles its answer would hold the attempt as long
        as it trickles. The answer is streamed and read here under a
        :class:`Watchdog`, which shuts the attempt's socket down at its deadline;
        the attempt then fails as a read timeout (it was sent: it may have run).
        Its socket is known from the connection's creation (the ``trace``
        extension) or, on a reused connection, from the head's arrival on: httpx
        exposes no pooled connection's socket before that, so a head trickled on
        a *reused* connection is bounded per read only (a new connection — every
        retry after a timeout — is bounded whole). A shut-down socket left in the
        pool reads as closed, and the pool drops it.
        """
        _with_timeout(request, timeout)
        watchdog = Watchdog(timeout)
        request.extensions["trace"] = _tracer(watchdog)
        response: httpx.Response | None = None
        try:
            response = self.http.send(request, stream=True)
            _watch_stream(watchdog, response.extensions.get("network_stream"))
            response.read()
            return response
        except httpx.UnsupportedProtocol:
            raise  # a bad URL: nothing was sent
        except httpx.TransportError as error:
            if not watchdog.expired:
                return error
            timed_out = httpx.ReadTimeout(f"the attempt outlived its {timeout:.3g} s deadline", request=request)
            timed_out.__cause__ = error
            return timed_out
        finally:
            watchdog.finish()
            if response is not None and not response.is_closed:
                response.close()  # a discarded answer gives its connection back

    def post(self, url: httpx.URL | str, *, operation: Operation | None = None, **options: Any) -> Response:
        """``send(operation, "POST", url, ...)``."""
        return self.send(operation, "POST", url, **options)

    def close(self) -> None:
        """Closes the ``httpx.Client`` if this client made it."""
        if self._owned:
            self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient:
    """:class:`Client` on ``httpx.AsyncClient``, for asyncio and trio. Each
    attempt is bounded as a whole (``anyio.fail_after``), and cancelling the task
    cancels the attempts and the waits between them."""

    def __init__(
        self, http: httpx.AsyncClient | None = None, *, policy: RetryPolicy | None = None, **httpx_options: Any
    ) -> None:
        if http is not None and httpx_options:
            raise TypeError("give either an httpx.AsyncClient or the options to make one, not both")
        self._owned = http is None
        self.http = http if http is not None else httpx.AsyncClient(**httpx_options)
        self.policy = policy or RetryPolicy()

    async def send(
        self,
        operation: Operation | None,
        method: str,
        url: httpx.URL | str,
        *,
        content: Content | Any = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Any = None,
        policy: RetryPolicy | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> Response:
        """See :meth:`Client.send`."""
        request, attempts = _prepare(
            self.http, operation, method, url, content=content, json=json,
            headers=headers, params=params, policy=policy or self.policy,
        )
        while True:
            timeout = attempts.next()
            _with_timeout(request, timeout)
            outcome: httpx.Response | Exception
            try:
                with anyio.fail_after(timeout):
                    outcome = await self.http.send(request)
            except httpx.UnsupportedProtocol:
                raise
            except (httpx.TransportError, TimeoutError) as error:
                outcome = error
            wait = _judge(attempts, outcome, on_attempt)
            if wait is None:
                return _finish(attempts, outcome)
            await anyio.sleep(wait)

    async def post(self, url: httpx.URL | str, *, operation: Operation | None = None, **options: Any) -> Response:
        """``send(operation, "POST", url, ...)``."""
        return await self.send(operation, "POST", url, **options)

    async def aclose(self) -> None:
        """Closes the ``httpx.AsyncClient`` if this client made it."""
        if self._owned:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
