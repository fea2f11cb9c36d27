"""What waits in the agents' queues: how many messages (the broker's count) and which steps they
likely are (the store's running steps, last dispatched first) — what the Supervisor's pacing of
retries and its at-risk watch go by.

The depths are read several times a second (:mod:`sas_app.supervision.forecast.watch`), so each thread
of a process keeps one broker connection for them, tried once and with a timeout on each read: with the
broker down a read is blind at once, not after seconds of retries, nor held by a connection half open.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kombu.exceptions import ChannelError

from sas_app.messaging.routing import agent_queue
from sas_app.settings import Settings
from sas_app.store import StepRow, Store, Tx

if TYPE_CHECKING:
    from celery import Celery
    from kombu.connection import Connection

log = logging.getLogger(__name__)

#: How many of a deep queue's waiting steps the at-risk watch and the pacing of retries look at,
#: head first (those behind them are counted as work still to do): which steps a backlog makes
#: late, and when a retry sent now would be taken, depend on all of them.
QUEUE_LOOKS_AT = 5000
#: A read of a queue's depth that takes longer than this (seconds) is a broker not answering.
READ_TIMEOUT_S = 2.0


def queued_steps(tx: Tx, agent: str, depth: int, read_at: float | None = None) -> tuple[list[StepRow], int]:
    """The steps whose messages likely wait in ``agent``'s queue of ``depth`` messages (read at
    ``read_at``, the store's clock: the steps dispatched since are not among them), its head first
    (at most :data:`QUEUE_LOOKS_AT`), and how many messages wait behind them not looked at: work
    still to do; past the running steps they are those of attempts already given up, dropped
    unworked."""
    queued = tx.sweep.queued_steps(agent, depth, QUEUE_LOOKS_AT, read_at) if depth else []
    return queued, depth - len(queued) if len(queued) == QUEUE_LOOKS_AT else 0


@dataclass(frozen=True)
class Depths:
    """How many messages wait in the queue of each agent with a step running (``of``; None where
    the broker did not answer), and when they were read (``at``: the store's clock just before the
    first read). A step dispatched after ``at`` is not counted in them: counted as waiting among
    the last dispatched, such steps (the agents' next steps, retries, dispatched while a
    look read the depths and then the running steps) pushed as many out at the queue's head —
    the steps nearest their complete-by, those a look in their last interval tells."""

    of: dict[str, int | None]
    at: float | None


class QueueDepths:
    """The depths of the agents' queues, read from the broker on a connection each thread keeps."""

    def __init__(self, store: Store, celery: Celery, settings: Settings) -> None:
        self.store = store
        self.celery = celery
        self.settings = settings
        #: per thread (a worker's pool may be threads), the connection and the process it was made in
        self._local = threading.local()

    def of_busy_agents(self) -> Depths:
        """How many messages wait in the queue of each agent with a step running, and when they
        were read, outside any transaction."""
        with self.store.begin() as tx:
            agents = tx.sweep.busy_agents()
            at = tx.now() if agents else None
        return Depths({agent: self.read(agent_queue(agent)) for agent in agents}, at)

    def read(self, queue: str) -> int | None:
        """How many messages wait in ``queue``; None if the broker did not answer."""
        pid, conn = self._kept()
        try:
            if conn is None or pid != os.getpid():
                conn = self.celery.connection_for_read(transport_options=self._timeouts())
                self._local.reader = (os.getpid(), conn)
            conn.ensure_connection(max_retries=0)
            return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
        except ChannelError:  # nothing waits in it: on Redis an empty queue is no key; on AMQP a
            if self.settings.amqp_broker:  # queue nobody declared yet, and the channel is closed
                self._drop()
            return 0
        except Exception:  # the broker down or a hiccup: nothing to judge by
            self._drop()
            return None

    def _timeouts(self) -> dict[str, float]:
        """The broker transport's options for a read that gives up after :data:`READ_TIMEOUT_S`."""
        if self.settings.amqp_broker:
            return {"read_timeout": READ_TIMEOUT_S, "write_timeout": READ_TIMEOUT_S}
        if self.settings.redis_broker:
            return {"socket_timeout": READ_TIMEOUT_S}
        return {}

    def _kept(self) -> tuple[int, Connection | None]:
        return getattr(self._local, "reader", (0, None))

    def _drop(self) -> None:
        pid, conn = self._kept()
        self._local.reader = (0, None)
        if conn is not None and pid == os.getpid():
            try:
                conn.release()  # type: ignore[no-untyped-call]
            except Exception:  # already broken: nothing to close cleanly
                log.debug("closing the queue-depth connection failed", exc_info=True)
