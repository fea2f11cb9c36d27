"""Workers back on their broker within a second of it coming back.

A Celery worker that lost its broker connects again with kombu's default back-off: 2 s, then 2 s
longer at each try, up to 30 s between tries. After a 7 s broker outage the agent workers of a
chaos run came back 14 s after the broker did, and every step dispatched meanwhile passed its
complete-by waiting in their queues — then its retry did, behind the backlog that had built up. A
step's complete-by is seconds, so a worker here tries again at most a second apart: one connection
attempt a second for each worker, nothing to a broker that is down.

``celery_settings`` names :class:`Consumer` as every worker's consumer (``worker_consumer``).
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

#: the back-off between tries to reach the broker (kombu's ``ensure_connection``): the first after
#: 0.2 s, each 0.4 s longer than the one before, at most 1 s
INTERVALS = {"interval_start": 0.2, "interval_step": 0.4, "interval_max": 1.0}

#: the setting's value
NAME = f"{__name__}:Consumer"


class Consumer(CeleryConsumer):  # type: ignore[misc]
    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(conn.ensure_connection, **INTERVALS)
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection  # the connection's own method again
