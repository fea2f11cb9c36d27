"""An attempt's transient faults, kept for its history: the agent counts them as it retries
in-process and sends the account with its reply; the Scheduler writes it as one event of the run's
history (``faults``), shown by ``sas show`` and the run's page.

The account is bounded — how many, the first, and the last :data:`KEPT`, each message cut to
:data:`MESSAGE_CHARS` — so a step retried a thousand times still writes one small event, and one
read from the broker is checked and cut again (:func:`from_message`) before it reaches the store.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from sas_app.errors import PermanentError, TransientError

#: the latest faults kept after the first
KEPT = 3
#: a fault's message is cut to this many characters
MESSAGE_CHARS = 300


class FaultLog:
    """The transient faults of one attempt, as the agent meets them."""

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        self.last: deque[str] = deque(maxlen=KEPT)

    def add(self, exc: BaseException) -> str:
        """Count ``exc``; returns its message as kept."""
        message = describe(exc)[:MESSAGE_CHARS]
        self.count += 1
        if self.first is None:
            self.first = message
        else:
            self.last.append(message)
        return message

    def summary(self) -> dict[str, Any] | None:
        """``{"count", "first", "last"}`` (``last``: the latest after the first), or None if none."""
        if not self.count:
            return None
        return {"count": self.count, "first": self.first, "last": list(self.last)}


def describe(exc: BaseException) -> str:
    """A fault as an operator reads it: its message, with its type unless it is one of ours."""
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, (TransientError, PermanentError)) else f"{type(exc).__name__}: {text}"


def from_message(faults: Any) -> dict[str, Any] | None:
    """An account of faults as it came from the broker, checked and bounded; None if it is not one."""
    if not isinstance(faults, dict) or not isinstance(faults.get("count"), int) or faults["count"] < 1:
        return None
    last = faults.get("last")
    last = last if isinstance(last, list) else []
    return {"count": faults["count"], "first": str(faults.get("first"))[:MESSAGE_CHARS],
            "last": [str(m)[:MESSAGE_CHARS] for m in last[-KEPT:]]}
