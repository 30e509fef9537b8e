"""Typed outcomes: what went wrong, and whether the operation may have run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Mapping, Optional

#: The default base of idemgate's problem types (the operator may set another: ``--problem-type-base``).
PROBLEM_BASE = "/problems/"


@dataclass(frozen=True)
class Problem:
    """An ``application/problem+json`` answer (RFC 9457), as the server sent it.

    An answer that is not problem+json (a plain-text 502 from a load balancer) is
    read as RFC 9457 says: type ``about:blank``, the status's phrase as the title.
    """

    #: The problem type URI (``/problems/…`` for idemgate's own).
    type: str
    #: Short, the same for every occurrence of the type.
    title: Optional[str]
    #: The HTTP status of the answer.
    status: int
    #: What happened this time.
    detail: Optional[str]
    #: The whole problem object, for extension members; ``None`` when not problem+json.
    body: Optional[Mapping[str, Any]] = None

    def is_idemgate(self, slug: str) -> bool:
        """Whether this is idemgate's problem with this slug (``key-reused``, …):
        the type URI decides, never the wording. The operator may set the
        types' base (``--problem-type-base``), so the slug is compared: the
        type's last segment after a ``/``, ``:`` or ``#``."""
        base = self.type[: -len(slug)] if slug and self.type.endswith(slug) else None
        return base is not None and base[-1:] in ("/", ":", "#")

    @classmethod
    def read(cls, status: int, content_type: str, body: bytes) -> Problem:
        """Reads the problem from an answer's parts."""
        parsed: dict[str, Any] | None = None
        if content_type.startswith("application/problem+json"):
            try:
                value = json.loads(body)
            except ValueError:
                value = None
            if isinstance(value, dict):
                parsed = value

        def text(name: str) -> str | None:
            value = parsed.get(name) if parsed is not None else None
            return value if isinstance(value, str) else None

        try:
            phrase: str | None = HTTPStatus(status).phrase
        except ValueError:
            phrase = None
        return cls(
            type=text("type") or "about:blank",
            title=text("title") or phrase,
            status=status,
            detail=text("detail"),
            body=parsed,
        )

    def __str__(self) -> str:
        out = f"{self.status} {self.type}"
        if self.title is not None:
            out += f" ({self.title})"
        if self.detail is not None:
            out += f": {self.detail}"
        return out


class IdemgateError(Exception):
    """Why an operation did not end in a ``2xx``/``3xx`` response.

    :attr:`may_have_run` says whether the operation may have taken effect on the
    server — the question an application must answer before telling its user "not
    paid". When it is true, resume the same :class:`Operation` later to learn the
    outcome, never a new one.
    """

    #: Whether the operation may have taken effect on the server.
    may_have_run: bool
    #: Attempts sent (0 when refused before the first).
    attempts: int

    def __init__(self, message: str, *, may_have_run: bool, attempts: int) -> None:
        super().__init__(message)
        self.may_have_run = may_have_run
        self.attempts = attempts


class KeyReusedError(IdemgateError):
    """``422`` ``key-reused``: the key was used before for a *different* request
    (another body, path or method). This request did not run, and is never retried.
    A bug in the caller, usually: one key per action, its body fixed once made."""

    def __init__(self, problem: Problem, attempts: int) -> None:
        super().__init__(
            f"the Idempotency-Key was already used for a different request: {problem}",
            may_have_run=False,
            attempts=attempts,
        )
        #: The server's answer.
        self.problem = problem


class InProgressError(IdemgateError):
    """``409`` ``in-progress`` after the retries ran out (or the deadline left no
    time to wait): the first attempt is still running on the server. It may well
    succeed; ask again later with the same :class:`Operation`."""

    def __init__(self, problem: Problem, retry_after: float | None, attempts: int) -> None:
        super().__init__(
            f"the operation is still running on the server: {problem}",
            may_have_run=True,
            attempts=attempts,
        )
        #: The server's answer.
        self.problem = problem
        #: The server's last ``Retry-After``, in seconds.
        self.retry_after = retry_after


class RejectedError(IdemgateError):
    """Any other ``4xx``/``5xx`` that is the outcome: a refused request, a replayed
    failure, or a ``5xx`` the retries did not get past."""

    def __init__(self, problem: Problem, *, replayed: bool, may_have_run: bool, attempts: int) -> None:
        super().__init__(f"the server answered {problem}", may_have_run=may_have_run, attempts=attempts)
        #: The server's answer: ``type``, ``title``, ``status``, ``detail``.
        self.problem = problem
        #: It was a replay (``Idempotent-Replayed: true``): the operation's stored outcome.
        self.replayed = replayed

    @property
    def status(self) -> int:
        """The answer's HTTP status."""
        return self.problem.status


class TransportError(IdemgateError):
    """No answer: every attempt failed in transport (refused, reset, cut off,
    timed out), or the deadline cut the last. ``__cause__`` is the last failure."""

    def __init__(self, *, may_have_run: bool, attempts: int) -> None:
        super().__init__("no answer from the server", may_have_run=may_have_run, attempts=attempts)


class StreamRestartedError(IdemgateError):
    """A streamed answer broke off, and the attempt that asked for it again was
    answered by a new run of the operation, not the first run's stream: the
    server did not keep that run (a cut stream is released by the route's
    server-error policy, PROTOCOL §20). The events handed on so far were that
    run's; the new run is now the operation's outcome — ask for it with the same
    :class:`Operation` to read its stream whole. It ran: ``may_have_run`` is true."""

    def __init__(self, *, attempts: int) -> None:
        super().__init__(
            "the stream broke off and the server ran the operation again rather than resume it: "
            "the events so far were a run it did not keep",
            may_have_run=True,
            attempts=attempts,
        )


class BodyNotReplayableError(IdemgateError):
    """The request body is a stream (an iterator, a generator, a file), which
    cannot be sent again byte for byte on a retry. Nothing was sent: buffer it
    (``bytes``, ``str``, or ``json=``)."""

    def __init__(self) -> None:
        super().__init__(
            "the request body is a stream and cannot be replayed on a retry; nothing was sent: buffer the body",
            may_have_run=False,
            attempts=0,
        )
