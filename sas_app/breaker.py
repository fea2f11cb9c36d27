"""A circuit breaker per agent, shared by every worker process through Redis (pybreaker's Redis
storage), so that when a remote service keeps failing the agents stop calling it.

While the breaker is open a call is not made: the agent defers the step (it goes back to pending
until the breaker may close, and its failure budget is untouched). Once the reset timeout has
passed, exactly one process at a time — the holder of a short Redis lock — makes a probe call;
the others keep deferring. A successful probe closes the breaker for everyone.

Without Redis (the embedded default) the breaker lives in each worker process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

import pybreaker
import redis

log = logging.getLogger("sas.breaker")

T = TypeVar("T")


class BreakerOpen(Exception):
    """The agent's breaker is open (or another process is probing): retry after ``delay`` s."""

    def __init__(self, agent: str, delay: float) -> None:
        super().__init__(f"circuit breaker of agent {agent!r} is open; retry in {delay:.1f}s")
        self.delay = delay


class _RedisStorage(pybreaker.CircuitRedisStorage):
    """pybreaker's Redis storage keeps when the breaker opened in whole seconds, which would let a
    probe through up to a second early; this one keeps the exact time."""

    @property
    def opened_at(self) -> datetime | None:
        value = self._redis.get(self._namespace("opened_at_exact"))
        return datetime.fromtimestamp(float(value), tz=timezone.utc) if value else None

    @opened_at.setter
    def opened_at(self, when: datetime) -> None:
        self._redis.set(self._namespace("opened_at_exact"), when.timestamp())


class Breaker:
    """The breaker of one agent. ``counts(exc)`` says whether a failure is the service's fault."""

    def __init__(self, agent: str, fail_max: int, reset_timeout: float, redis_url: str | None,
                 counts: Callable[[BaseException], bool]) -> None:
        self.agent = agent
        self.fail_max = fail_max
        self.reset_timeout = reset_timeout
        self.redis_url = redis_url
        self.counts = counts
        self._pid = 0
        self._lock = threading.Lock()
        self._breaker: pybreaker.CircuitBreaker | None = None
        self._redis: redis.Redis | None = None

    def _get(self) -> pybreaker.CircuitBreaker:
        with self._lock:
            if self._breaker is None or self._pid != os.getpid():  # one client per (forked) process
                storage: pybreaker.CircuitBreakerStorage
                if self.redis_url:
                    self._redis = redis.Redis.from_url(self.redis_url, socket_timeout=2)
                    storage = _RedisStorage(pybreaker.STATE_CLOSED, self._redis, namespace=f"sas:breaker:{self.agent}")
                else:
                    storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
                self._breaker = pybreaker.CircuitBreaker(
                    fail_max=self.fail_max, reset_timeout=self.reset_timeout, state_storage=storage,
                    exclude=[lambda exc: not self.counts(exc)], name=self.agent,
                )
                self._pid = os.getpid()
            return self._breaker

    def open_for(self) -> float:
        """Seconds until the breaker lets a probe through (0 when closed or due a probe)."""
        breaker = self._get()
        if breaker.current_state != pybreaker.STATE_OPEN:
            return 0.0
        opened_at = breaker._state_storage.opened_at
        waited = (datetime.now(timezone.utc) - opened_at).total_seconds() if opened_at else self.reset_timeout
        return max(self.reset_timeout - waited, 0.0)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        breaker = self._get()
        state = breaker.current_state
        if state != pybreaker.STATE_CLOSED:
            wait = self.open_for()
            if wait > 0:
                raise BreakerOpen(self.agent, wait)
            if not self._may_probe():
                raise BreakerOpen(self.agent, min(1.0, self.reset_timeout))
            log.warning("agent %s: probing its service (breaker %s)", self.agent, state)
        try:
            return breaker.call(fn, *args)
        except pybreaker.CircuitBreakerError:
            log.error("agent %s: breaker opened after %d failures", self.agent, self.fail_max)
            raise BreakerOpen(self.agent, self.reset_timeout) from None

    def _may_probe(self) -> bool:
        """One probe at a time across processes: whoever sets the lock key first."""
        if self._redis is None:
            return True
        key = f"sas:breaker:{self.agent}:probe"
        return bool(self._redis.set(key, os.getpid(), nx=True, px=int(max(self.reset_timeout, 1.0) * 1000)))

    @property
    def state(self) -> str:
        return str(self._get().current_state)
