"""One logical action, one key (PROTOCOL §14)."""

from __future__ import annotations

import hashlib
import uuid

#: The longest key an idemgate server accepts by default (PROTOCOL §2).
MAX_KEY_LENGTH = 255


class InvalidKeyError(ValueError):
    """A stored key the server would refuse, so it cannot name an operation."""


class Operation:
    """One logical action of the user — the "Pay" click — and the
    ``Idempotency-Key`` every attempt of it carries.

    Make it when the user acts, not per HTTP attempt: every retry of the action must
    carry the same key, or the server cannot tell a retry from a second purchase.
    Store :attr:`key` beside the action (an outbox row, a job's arguments) to
    survive a restart, and :meth:`resume` it.

    ``repr`` and ``str`` show a digest of the key, never the key: keys are lookup
    handles and do not belong in logs.

    >>> checkout = Operation()
    >>> saved = checkout.key            # persist with the pending order
    >>> Operation.resume(saved) == checkout
    True
    """

    __slots__ = ("_key",)

    def __init__(self) -> None:
        # uuid4 draws from os.urandom: cryptographically strong.
        self._key = str(uuid.uuid4())

    @classmethod
    def resume(cls, key: str) -> Operation:
        """The action a stored key names, to retry it after a restart.

        The key must be one the server accepts as a bare header value: 1 to 255
        printable ASCII characters without ``,``, ``"`` or spaces (PROTOCOL §2; a
        UUID always is).

        :raises InvalidKeyError: when it is not.
        """
        problem = _key_problem(key)
        if problem is not None:
            raise InvalidKeyError(problem)
        operation = cls.__new__(cls)
        operation._key = key
        return operation

    @property
    def key(self) -> str:
        """The key, to persist. Do not log it: log :attr:`digest`."""
        return self._key

    @property
    def digest(self) -> str:
        """``sha256:`` and the first 12 hex digits of the key's SHA-256, as the
        server's logs and traces show it."""
        return "sha256:" + hashlib.sha256(self._key.encode("ascii")).hexdigest()[:12]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Operation) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Operation({self.digest}…)"

    __str__ = __repr__


def _key_problem(key: str) -> str | None:
    if not isinstance(key, str) or not key:
        return "the Idempotency-Key is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"the Idempotency-Key is longer than {MAX_KEY_LENGTH} characters"
    # Visible ASCII (0x21-0x7e), without the list separator and the quote.
    if any(not 0x21 <= ord(c) <= 0x7E or c in ',"' for c in key):
        return "the Idempotency-Key contains a character that is not allowed"
    return None
