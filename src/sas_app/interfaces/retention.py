"""Retention: nothing is ever deleted unless asked. ``sas purge --older-than 30d`` deletes finished
runs that ended that long ago, with their steps, events, signals, alerts and notifications, in
bounded batches (one transaction each: the hot path waits for at most one batch); with
``SAS_RETENTION=30d`` beat does it every ten minutes (``sas.retention.purge`` on the Supervisor's
queue, at most ``MAX_BATCHES`` batches a time). A run not finished is never deleted, nor a child run
whose parent is not; ``error`` runs only when named (they wait for an operator). Each purge also
deletes the rate limits' schedules idle for :data:`IDLE_RATE_LIMIT` seconds (see
:meth:`~sas_app.store.retention.RetentionQueries.purge_idle_rate_limits`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from sas_app.messaging.routing import PURGE, SUPERVISOR_QUEUE, confirm_options
from sas_app.settings import Settings
from sas_app.states import TERMINAL_RUN_STATES
from sas_app.store import Store

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

#: batches one beat-driven purge deletes at most (the next one, ten minutes later, goes on)
MAX_BATCHES = 20
BATCH = 1000
INTERVAL = 600.0
#: seconds a rate limit's schedule has been idle before a purge deletes it
IDLE_RATE_LIMIT = 3600.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s`` or plain seconds; ``ValueError`` naming the problem."""
    found = _DURATION.match(text or "")
    if not found:
        raise ValueError(f"{text!r} is not a duration: a number with d, h, m or s (30d, 12h, 3600)")
    return float(found.group(1)) * _UNIT[found.group(2)]


def parse_states(text: str) -> list[str]:
    """Finished states, comma-separated; ``ValueError`` naming any that is not one."""
    states = [s.strip() for s in text.split(",") if s.strip()]
    wrong = [s for s in states if s not in TERMINAL_RUN_STATES]
    if not states or wrong:
        raise ValueError(f"states must be finished ones, from {', '.join(TERMINAL_RUN_STATES)}; got {text!r}")
    return states


@dataclass(frozen=True)
class Purged:
    runs: int
    rows: int
    seconds: float
    #: idle rate-limit schedules deleted
    schedules: int = 0


def purge(store: Store, older_than: float, states: Sequence[str], *, batch: int = BATCH,
          max_batches: int | None = None) -> Purged:
    """Delete, batch by batch, the finished runs in ``states`` that ended ``older_than`` seconds ago."""
    started, total_runs, total_rows, batches = time.perf_counter(), 0, 0, 0
    while max_batches is None or batches < max_batches:
        deleted, rows = store.purge_batch(older_than, states, batch)
        total_runs, total_rows, batches = total_runs + deleted, total_rows + rows, batches + 1
        if deleted == 0:  # a short batch may be runs another transaction held: the next goes on
            break
    schedules = store.purge_idle_rate_limits(IDLE_RATE_LIMIT)
    return Purged(total_runs, total_rows, time.perf_counter() - started, schedules)


class Retention:
    def __init__(self, store: Store, settings: Settings, celery: Celery) -> None:
        self.store = store
        self.older_than = parse_duration(settings.retention) if settings.retention else None
        self.states = parse_states(settings.retention_states)

        @celery.task(name=PURGE, shared=False, ignore_result=True)
        def purge_task() -> int:
            return self.run().runs

        if self.older_than is not None:
            celery.conf.beat_schedule[PURGE] = {
                "task": PURGE, "schedule": timedelta(seconds=INTERVAL),
                "options": {"queue": SUPERVISOR_QUEUE, "expires": INTERVAL, **confirm_options(celery)},
            }

    def run(self) -> Purged:
        if self.older_than is None:
            return Purged(0, 0, 0.0)
        done = purge(self.store, self.older_than, self.states, max_batches=MAX_BATCHES)
        if done.runs or done.schedules:
            log.info("retention: %d finished run(s) deleted (%d rows) in %.1f s, %d idle rate-limit schedule(s)",
                     done.runs, done.rows, done.seconds, done.schedules)
        return done
