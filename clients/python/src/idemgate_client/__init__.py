"""The client half of the ``Idempotency-Key`` protocol (PROTOCOL §14) on
``httpx``, sync and async.

A request that timed out may have run. Sent again with the same key and the same
bytes, an idemgate server runs it at most once and answers the retry with the
first outcome (``Idempotent-Replayed: true``). This package makes sending it again
right by construction:

- an :class:`Operation` is one logical action ("Pay"): one UUID v4 key made once,
  sent on every attempt; :meth:`Operation.resume` picks it up after a restart;
- every attempt sends the same body bytes; a stream body is refused before the
  first attempt (:class:`BodyNotReplayableError`);
- the :class:`RetryPolicy` retries transport failures, ``409`` in progress (after
  its ``Retry-After``, capped), and ``5xx`` that are not replays, with exponential
  backoff and full jitter under a total deadline — never ``422``, other ``4xx``, or
  a replayed outcome; ``max_retries=0`` is one attempt;
- a ``POST``/``PATCH`` without an operation is sent exactly once;
- a streamed answer (``text/event-stream``, :meth:`Client.stream`) is read event
  by event; a connection that drops mid-stream is asked for again with the same
  key and ``Last-Event-ID``, each :class:`Event` handed on once, in order
  (:class:`StreamRestartedError` when the server ran the operation again instead);
- outcomes are typed: a :class:`Response` (``replayed``, ``attempts``) or an
  :class:`IdemgateError` — :class:`KeyReusedError`, :class:`InProgressError`,
  :class:`RejectedError`, :class:`TransportError` — with ``may_have_run``.

>>> from idemgate_client import Client, Operation
>>> def pay(client: Client, order: dict) -> None:
...     operation = Operation()  # when the user acts; persist operation.key to resume
...     response = client.post("/api/v1/orders", json=order, operation=operation)
...     print(response.status_code, response.replayed)

``idemgate_client.requests_adapter`` has the same policy as a ``requests``
transport adapter (the ``requests`` extra).
"""

from ._client import AsyncClient, AsyncEvents, AttemptReport, Client, Events, PendingEvents, Response
from ._errors import (
    PROBLEM_BASE,
    BodyNotReplayableError,
    IdemgateError,
    InProgressError,
    KeyReusedError,
    Problem,
    RejectedError,
    StreamRestartedError,
    TransportError,
)
from ._events import Event
from ._operation import MAX_KEY_LENGTH, InvalidKeyError, Operation
from ._policy import RetryPolicy

__all__ = [
    "AsyncClient",
    "AsyncEvents",
    "AttemptReport",
    "BodyNotReplayableError",
    "Client",
    "Event",
    "Events",
    "IdemgateError",
    "InProgressError",
    "InvalidKeyError",
    "KeyReusedError",
    "MAX_KEY_LENGTH",
    "Operation",
    "PROBLEM_BASE",
    "PendingEvents",
    "Problem",
    "RejectedError",
    "Response",
    "RetryPolicy",
    "StreamRestartedError",
    "TransportError",
]
