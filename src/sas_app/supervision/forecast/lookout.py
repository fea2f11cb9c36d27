"""The Supervisor's lookout: the at-risk looks (:mod:`sas_app.supervision.forecast.watch`) taken by
a thread of each worker that consumes the Supervisor's queue, every SAS_AT_RISK_INTERVAL — not sent
to it by beat through the broker.

Sent through the broker, no look would come while the broker is down, and the steps waiting in its
queues then are the likeliest of all to miss their complete-by. Taken here, a look goes on and
finds the broker not answering (:meth:`Watch.look`). And the broker carries no look: two beats
would send each one, several a second. Supervisor workers looking at once take each look once
between them (:meth:`Store.take_look`).

The thread runs in the worker's main process, and looks at a fixed rate (a look that took long is
followed by the next at once, not an interval later): in an outage each look tells the steps due before
the look after next (:func:`sas_app.supervision.forecast.queue_model.stranded`), and a step due in a gap
between such windows would be told by none. Its pool processes, forked from it, open database
connections of their own (:meth:`SasApp._after_fork`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)


class Lookout:
    """Calls ``look`` every ``every`` seconds from a daemon thread, from :meth:`start` to :meth:`stop`."""

    def __init__(self, look: Callable[[], Any], every: float) -> None:
        self.look = look
        self.every = every
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start looking; once, however many times the worker says it is ready."""
        if self.running:
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="sas-lookout", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        down = False  # the database did not answer the last look: said once, not ten times a second
        due = time.monotonic()
        while True:
            # at a fixed rate, an interval after the last look began; at once after one that took
            # longer (and no burst of looks after one that took several intervals)
            due = max(due + self.every, time.monotonic())
            if self._stopped.wait(due - time.monotonic()):
                return
            try:
                self.look()
            except SQLAlchemyError as exc:  # the database down: the next look tries again
                if not down:
                    log.warning("at-risk looks paused: the database did not answer: %s", str(exc).splitlines()[0])
                down = True
                continue
            except Exception:  # a look that failed must not end the looking
                log.exception("at-risk look failed")
                continue
            if down:
                log.info("at-risk looks resumed: the database answers again")
                down = False
