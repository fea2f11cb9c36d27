"""Reading the progress notifications sent to a submitter's ``reply_to`` queue.

Each notification is written to the ``outbox`` table in the same transaction as the state change
it reports, then relayed to the broker once that transaction has committed (:meth:`Router.relay`):
a crash between commit and publish neither loses a notification (the Supervisor relays what is
left) nor invents one (a rolled-back change leaves no row). A notification relayed twice carries
the same ``id``; :class:`Notifications` drops such duplicates.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from queue import Empty
from typing import TYPE_CHECKING, Any

from sas_app.messaging.routing import reply_queue

if TYPE_CHECKING:
    from celery import Celery


class Notifications:
    """Read the notifications sent to ``queue``, each once, in the order they were relayed.

    >>> with Notifications(sas.celery, "my-replies") as inbox:
    ...     for note in inbox.iter(timeout=30):
    ...         print(note["run_id"], note["kind"])
    """

    def __init__(self, celery: Celery, queue: str) -> None:
        self.celery = celery
        self.queue = queue
        self.seen: set[int] = set()
        self._conn: Any = None
        self._simple: Any = None

    def __enter__(self) -> Notifications:
        self._conn = self.celery.connection_for_read()
        self._simple = self._conn.SimpleQueue(reply_queue(self.queue), accept=["json"])
        return self

    def __exit__(self, *exc: object) -> None:
        self._simple.close()
        self._conn.release()

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next notification not seen before, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                message = self._simple.get(block=True, timeout=remaining)
            except Empty:
                return None
            body: dict[str, Any] = message.payload
            message.ack()
            if body.get("id") in self.seen:
                continue
            self.seen.add(body["id"])
            return body

    def iter(self, timeout: float) -> Iterator[dict[str, Any]]:
        """Notifications until none arrives for ``timeout`` seconds."""
        while (note := self.get(timeout)) is not None:
            yield note
