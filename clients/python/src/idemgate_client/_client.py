"""The clients: operations over ``httpx`` (sync and async), retried by the
:class:`RetryPolicy`, ending in a :class:`Response` or an :class:`IdemgateError`."""

from __future__ import annotations

import json as jsonlib
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Coroutine, Generator, Iterator, Mapping, NoReturn, Optional, Union

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
    StreamRestartedError,
    TransportError,
)
from ._event_stream import LAST_EVENT_ID
from ._events import Event, StreamState
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
    if isinstance(outcome, Exception) or outcome.status_code >= 400:
        _fail(attempts, outcome)
    return Response(outcome, attempts.made)


def _fail(attempts: Attempts, outcome: httpx.Response | Exception) -> NoReturn:
    """Raises the error the last attempt's unsuccessful outcome (no answer, or a
    ``4xx``/``5xx``) ends the operation with."""
    if isinstance(outcome, Exception):
        raise TransportError(may_have_run=attempts.may_have_run, attempts=attempts.made) from outcome
    raise _error_from_answer(outcome, attempts.may_have_run, attempts.made)


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


def _outlived(error: Exception, watchdog: Watchdog, timeout: float, request: httpx.Request) -> Exception:
    """A sync attempt's transport failure as what it was: a read timeout when its
    watchdog shut the socket down at the deadline."""
    if not watchdog.expired:
        return error
    timed_out = httpx.ReadTimeout(f"the attempt outlived its {timeout:.3g} s deadline", request=request)
    timed_out.__cause__ = error
    return timed_out


@dataclass
class _Open:
    """A sync attempt's successful answer whose body is still to be read — under
    the attempt's watchdog, which bounds the attempt to its last body byte."""

    response: httpx.Response
    watchdog: Watchdog
    timeout: float

    def cut(self, error: Exception) -> Exception:
        """The failure reading the body ended with (a read timeout at the deadline)."""
        return _outlived(error, self.watchdog, self.timeout, self.response.request)

    def close(self) -> None:
        self.watchdog.finish()
        self.response.close()


@dataclass
class _AsyncOpen:
    """An async attempt's successful answer whose body is still to be read, and
    the attempt's deadline (``anyio.current_time()``), to its last body byte."""

    response: httpx.Response
    deadline: float

    def left(self) -> float:
        """The time left to the attempt, to bound the next read by."""
        return max(0.0, self.deadline - anyio.current_time())

    async def close(self) -> None:
        await self.response.aclose()


def _ask_from(request: httpx.Request, last_event_id: str | None) -> None:
    """Sets (or, with ``None``, removes) the ``Last-Event-ID`` the next attempt
    of a stream's request carries."""
    if last_event_id is None:
        request.headers.pop(LAST_EVENT_ID, None)
    else:
        request.headers[LAST_EVENT_ID] = last_event_id


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
        outcome = self._open(request, timeout, keep_body=False)
        return outcome.response if isinstance(outcome, _Open) else outcome

    def _open(self, request: httpx.Request, timeout: float, *, keep_body: bool) -> httpx.Response | _Open | Exception:
        """:meth:`_attempt`; with ``keep_body``, a ``2xx``/``3xx`` answer's body is
        left unread, for the caller to read under the attempt's watchdog (a
        streamed answer). Any other answer is read whole, and closed."""
        _with_timeout(request, timeout)
        watchdog = Watchdog(timeout)
        request.extensions["trace"] = _tracer(watchdog)
        response: httpx.Response | None = None
        opened: _Open | None = None
        try:
            response = self.http.send(request, stream=True)
            _watch_stream(watchdog, response.extensions.get("network_stream"))
            if keep_body and response.status_code < 400:
                opened = _Open(response, watchdog, timeout)
                return opened
            response.read()
            return response
        except httpx.UnsupportedProtocol:
            raise  # a bad URL: nothing was sent
        except httpx.TransportError as error:
            return _outlived(error, watchdog, timeout, request)
        finally:
            if opened is None:  # else the watchdog and the answer are the caller's
                watchdog.finish()
                if response is not None and not response.is_closed:
                    response.close()  # a discarded answer gives its connection back

    def stream(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        operation: Operation | None = None,
        content: Content | Any = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Any = None,
        policy: RetryPolicy | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> Events:
        """Sends the attempts until one answers, and returns its body as an event
        stream (``text/event-stream``) to read as it arrives: iterating the
        :class:`Events` gives each event once, in order, and asks again for a
        stream whose connection dropped — with the operation's key and the
        ``Last-Event-ID`` of the last event received — under the same policy.

        Each attempt is bounded as a whole (``attempt_timeout``, to the last body
        byte) and the attempts together by the ``deadline``, as :meth:`send`'s
        are: a stream that outlasts its attempt is cut at its timeout and asked
        for again, so give a long stream a policy that covers it. Without an
        operation (and for a method that is not idempotent) a dropped stream is
        not asked for again: the error says so. ``on_attempt`` hears the
        successful answer's head when it comes, and the same attempt again if
        its body breaks off.

        >>> def chat(client: Client, ask: Operation) -> None:
        ...     with client.stream("POST", "/v1/chat/completions", operation=ask, json={"stream": True}) as events:
        ...         for event in events:
        ...             print(event.data, end="")

        :raises KeyReusedError, InProgressError, RejectedError, TransportError, BodyNotReplayableError:
            as :meth:`send`, when no attempt answered with a ``2xx``/``3xx``.
        """
        request, attempts = _prepare(
            self.http, operation, method, url, content=content, json=json,
            headers=headers, params=params, policy=policy or self.policy,
        )

        def ask(cut: Exception | None) -> _Open:
            """Attempts until one answers ``2xx``/``3xx``; ``cut``, when given, is
            the failure a stream broke off with, judged (and waited out) first."""
            failed: httpx.Response | Exception | None = cut
            while True:
                if failed is not None:
                    wait = _judge(attempts, failed, on_attempt)
                    if wait is None:
                        _fail(attempts, failed)
                    time.sleep(wait)
                outcome = self._open(request, attempts.next(), keep_body=True)
                if isinstance(outcome, _Open):
                    _judge(attempts, outcome.response, on_attempt)  # final: no wait
                    return outcome
                failed = outcome

        def again(cut: Exception, last_event_id: str | None) -> _Open:
            _ask_from(request, last_event_id)
            return ask(cut)

        return Events(ask(None), attempts, again)

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

    async def _open(self, request: httpx.Request, timeout: float) -> httpx.Response | _AsyncOpen | Exception:
        """One attempt of a streamed answer, bounded as a whole by ``timeout``: a
        ``2xx``/``3xx`` answer's body is left unread, for the caller to read
        before the attempt's deadline; any other answer is read whole, and closed."""
        _with_timeout(request, timeout)
        deadline = anyio.current_time() + timeout
        response: httpx.Response | None = None
        opened: _AsyncOpen | None = None
        try:
            with anyio.fail_after(timeout):
                response = await self.http.send(request, stream=True)
                if response.status_code < 400:
                    opened = _AsyncOpen(response, deadline)
                    return opened
                await response.aread()
                return response
        except httpx.UnsupportedProtocol:
            raise
        except (httpx.TransportError, TimeoutError) as error:
            return error
        finally:
            if opened is None and response is not None and not response.is_closed:
                with anyio.CancelScope(shield=True):  # closed even when the task is cancelled
                    await response.aclose()

    def stream(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        operation: Operation | None = None,
        content: Content | Any = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Any = None,
        policy: RetryPolicy | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> PendingEvents:
        """See :meth:`Client.stream`. Await it for the :class:`AsyncEvents`, or
        enter it (``async with``), which also closes them at the end::

            async with client.stream("POST", "/v1/chat/completions", operation=ask, json=body) as events:
                async for event in events:
                    print(event.data, end="")
        """

        async def start() -> AsyncEvents:
            request, attempts = _prepare(
                self.http, operation, method, url, content=content, json=json,
                headers=headers, params=params, policy=policy or self.policy,
            )

            async def ask(cut: Exception | None) -> _AsyncOpen:
                failed: httpx.Response | Exception | None = cut
                while True:
                    if failed is not None:
                        wait = _judge(attempts, failed, on_attempt)
                        if wait is None:
                            _fail(attempts, failed)
                        await anyio.sleep(wait)
                    outcome = await self._open(request, attempts.next())
                    if isinstance(outcome, _AsyncOpen):
                        _judge(attempts, outcome.response, on_attempt)  # final: no wait
                        return outcome
                    failed = outcome

            async def again(cut: Exception, last_event_id: str | None) -> _AsyncOpen:
                _ask_from(request, last_event_id)
                return await ask(cut)

            return AsyncEvents(await ask(None), attempts, again)

        return PendingEvents(start())

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


class _EventsBase:
    """What :class:`Events` and :class:`AsyncEvents` share: the answer being read,
    the operation's attempts, and what was read of its stream."""

    def __init__(self, response: httpx.Response, attempts: Attempts) -> None:
        self._response = response
        self._attempts = attempts
        self._state = StreamState()
        self._ended = False
        #: The first answer was the operation's stream replayed or joined rather
        #: than produced for this request (``Idempotent-Replayed: true``).
        self.replayed = is_replayed(response.headers)

    @property
    def status_code(self) -> int:
        """The answer's status."""
        return self._response.status_code

    @property
    def headers(self) -> httpx.Headers:
        """The headers of the answer being read (a resumed stream's are its replay's)."""
        return self._response.headers

    @property
    def attempts(self) -> int:
        """Attempts made so far, the ones that resumed the stream included."""
        return self._attempts.made


#: Asks for a stream again after it broke off with the failure given, carrying
#: the ``Last-Event-ID`` given (``None``: none): the next successful answer.
_Again = Callable[[Exception, Optional[str]], _Open]
_AsyncAgain = Callable[[Exception, Optional[str]], Coroutine[Any, Any, _AsyncOpen]]


class Events(_EventsBase):
    """A streamed answer (:meth:`Client.stream`): an iterator of :class:`Event`,
    each handed on once, in order, as it arrives — across the attempts that ask
    for the stream again when its connection drops.

    Use it as a context manager (or iterate it to its end) so that its
    connection is given back; :meth:`close` ends it early.

    Iterating raises what :meth:`Client.send` does when the stream cannot be
    resumed — :class:`TransportError` after the retries or the deadline,
    :class:`StreamRestartedError` when the server ran the operation again — and
    the events handed on so far stay the operation's first ones.
    """

    def __init__(self, first: _Open, attempts: Attempts, again: _Again) -> None:
        super().__init__(first.response, attempts)
        self._answer = first
        self._chunks: Iterator[bytes] = first.response.iter_bytes()
        self._again = again

    def __iter__(self) -> Events:
        return self

    def __next__(self) -> Event:
        while True:
            if self._state.ready:
                return self._state.ready.popleft()
            if self._ended:
                raise StopIteration
            try:
                # Decoded bytes: the representation, which is what the server
                # stores and resumes in (never a content coding's bytes).
                chunk = next(self._chunks, None)
            except httpx.TransportError as error:
                cut = self._answer.cut(error)
                self._answer.close()
                self._resume(cut)
                continue
            if chunk is None:
                self._state.finish()
                self.close()
            else:
                self._state.feed(chunk)

    def _resume(self, cut: Exception) -> None:
        """After the stream broke off with ``cut``: the attempts that ask for it
        again, until one answers with the operation's stream."""
        last_event_id, starts_at = self._state.resumption()
        try:
            answer = self._again(cut, last_event_id)
        except BaseException:
            self._ended = True
            raise
        if not is_replayed(answer.response.headers):
            answer.close()
            self._ended = True
            raise StreamRestartedError(attempts=self._attempts.made)
        self._answer, self._response = answer, answer.response
        self._chunks = answer.response.iter_bytes()
        self._state.resume_at(starts_at)

    def close(self) -> None:
        """Ends the stream here and gives its connection back."""
        self._ended = True
        self._answer.close()

    def __enter__(self) -> Events:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncEvents(_EventsBase):
    """:class:`Events` on the :class:`AsyncClient`: an async iterator of
    :class:`Event`. Each read is bounded by what is left of its attempt, and
    cancelling the task cancels the read and the resumption's waits."""

    def __init__(self, first: _AsyncOpen, attempts: Attempts, again: _AsyncAgain) -> None:
        super().__init__(first.response, attempts)
        self._answer = first
        self._chunks: AsyncIterator[bytes] = first.response.aiter_bytes()
        self._again = again

    def __aiter__(self) -> AsyncEvents:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._state.ready:
                return self._state.ready.popleft()
            if self._ended:
                raise StopAsyncIteration
            try:
                with anyio.fail_after(self._answer.left()):
                    chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._state.finish()
                await self.aclose()
                continue
            except (httpx.TransportError, TimeoutError) as cut:
                await self._answer.close()
                await self._resume(cut)
                continue
            self._state.feed(chunk)

    async def _resume(self, cut: Exception) -> None:
        """See :meth:`Events._resume`."""
        last_event_id, starts_at = self._state.resumption()
        try:
            answer = await self._again(cut, last_event_id)
        except BaseException:
            self._ended = True
            raise
        if not is_replayed(answer.response.headers):
            await answer.close()
            self._ended = True
            raise StreamRestartedError(attempts=self._attempts.made)
        self._answer, self._response = answer, answer.response
        self._chunks = answer.response.aiter_bytes()
        self._state.resume_at(starts_at)

    async def aclose(self) -> None:
        """Ends the stream here and gives its connection back."""
        self._ended = True
        with anyio.CancelScope(shield=True):  # closed even when the task is cancelled
            await self._answer.close()

    async def __aenter__(self) -> AsyncEvents:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


class PendingEvents:
    """What :meth:`AsyncClient.stream` returns: awaited, the :class:`AsyncEvents`
    once an attempt answered; entered (``async with``), the same, closed when the
    block ends — the way ``httpx.AsyncClient.stream`` is used."""

    def __init__(self, start: Coroutine[Any, Any, AsyncEvents]) -> None:
        self._start = start
        self._events: AsyncEvents | None = None

    def __await__(self) -> Generator[Any, None, AsyncEvents]:
        return self._start.__await__()

    async def __aenter__(self) -> AsyncEvents:
        self._events = await self._start
        return self._events

    async def __aexit__(self, *_: object) -> None:
        if self._events is not None:
            await self._events.aclose()
