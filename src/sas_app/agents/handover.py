"""The next step of a straight line run by the worker that completed the step before it.

When a step completes in an agent's worker (its reply handled in process) and the step the
Scheduler starts next belongs to the same agent, the worker runs it itself instead of publishing
its message and waiting for the broker to hand it back: no publish, no delivery, no
acknowledgement, for the same transitions in the store — the step is marked running with its
complete-by before it runs, as for a message. Temporal calls this eager execution.

The step runs under the Celery task of the message that began the sequence, so it is only taken
while its whole timeout ends before that message's soft time limit (and so before the hard limit
and a drain's grace period), at most ``SAS_EAGER_STEPS`` in a row, and never once its worker has
begun to shut down (a scale-down's SIGTERM: :func:`drain`). Should the worker die while
it runs one, there is no message to redeliver: the Supervisor finds the step at its complete-by,
as it finds a lost message, and the next attempt runs without a failure counted.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Container
from dataclasses import dataclass
from multiprocessing.synchronize import Event

from sas_app.messaging.routing import AgentMessage

#: set once the worker shuts down; made in its main process before the pool processes are forked,
#: so that they see it too (None outside a worker: nothing to drain)
_draining: Event | None = None


def watch_for_drain() -> None:
    """In a worker's main process, before its pool starts: the flag :func:`drain` sets."""
    global _draining
    _draining = multiprocessing.Event()


def drain() -> None:
    """The worker has begun to shut down: its processes finish the steps they hold and take no
    more of their own replies' steps (those are published, for the workers that stay)."""
    if _draining is not None:
        _draining.set()


@dataclass
class Handover:
    """One agent task's keeper of the next step (see :func:`~sas_app.messaging.routing.keeping`)."""

    #: the agent whose steps it takes
    agent: str
    #: the names of that agent's actions this process has
    actions: Container[str]
    #: the agent's clock
    clock: Callable[[], float]
    #: the clock's time the task's soft time limit comes (None: it has none)
    ends: float | None
    #: steps it may still take
    left: int
    #: the step taken and not yet run
    taken: AgentMessage | None = None

    def __call__(self, message: AgentMessage) -> bool:
        """Take ``message`` (True) if it is this agent's, none is taken yet, the worker is not
        shutting down, and its whole timeout fits before the soft time limit."""
        if (self.taken is not None or self.left <= 0 or message.agent != self.agent
                or message.action not in self.actions or (_draining is not None and _draining.is_set())):
            return False
        if self.ends is not None and self.clock() + message.timeout >= self.ends:
            return False
        self.taken = message
        self.left -= 1
        return True

    def next(self) -> AgentMessage | None:
        """The step taken, to run now (None: none)."""
        taken, self.taken = self.taken, None
        return taken
