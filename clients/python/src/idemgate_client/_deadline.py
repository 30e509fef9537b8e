"""The deadline of one synchronous attempt, over its whole exchange (connect,
request, response head and body).

A read timeout is per read: a server that sends one byte a second resets it with
every byte and keeps a blocking attempt alive for as long as it likes. A
:class:`Watchdog` is a timer thread that, at the attempt's deadline, shuts down
the attempt's socket — which wakes a ``recv`` blocked in another thread, so the
attempt fails at once (and, being connected, may have run). The attempts tell it
their socket as soon as they know it. (The async client needs none of this: it
cancels the attempt with ``anyio.fail_after``.)
"""

from __future__ import annotations

import socket
import threading
from typing import Callable, Optional, Union

#: A socket, or how to find it when the deadline comes (a pooled connection's
#: ``sock`` is only set once it is connected).
Target = Union[socket.socket, Callable[[], object]]


class Watchdog:
    """Ends one attempt at ``seconds`` from now by shutting its socket down.

    Once :meth:`finish` ran, nothing is shut down (its lock orders the two). In
    the instant between the answer's last byte and :meth:`finish`, a shutdown
    can still hit a connection just given back to its pool; httpcore's and
    urllib3's pools check an idle connection before reusing it, find it closed
    and open another, so no later request sees it."""

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._target: Optional[Target] = None
        self._done = False
        self.expired = False
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, target: object) -> None:
        """The attempt's socket (a new connection's, or the one its answer came
        on), or a callable that returns it. Anything else — a transport without
        a socket (a mock) — is not watched."""
        if not isinstance(target, socket.socket) and not callable(target):
            return
        with self._lock:
            if self._done:
                return
            self._target = target
            if self.expired:
                _shutdown(target)

    def finish(self) -> None:
        """The attempt is over: nothing is shut down from now on."""
        with self._lock:
            self._done = True
            self._target = None
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            if self._target is not None:
                _shutdown(self._target)


def _shutdown(target: Target) -> None:
    sock = target if isinstance(target, socket.socket) else target()
    if not isinstance(sock, socket.socket):
        return  # not connected yet: the connect timeout bounds that part
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing blocks on it
