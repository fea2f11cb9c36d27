"""A circuit breaker per agent, shared by every worker process (pybreaker over a shared state), so
that when a remote service keeps failing the agents stop calling it.

It counts failures of distinct calls: an attempt's first try counts, its in-process retries do not
(their successes still close the count), so one step retried five times cannot open the breaker
for every run, while five steps in a row failing at their first try — a service down for
everyone — open it as before. Any success in between starts the count again.

While the breaker is open a call is not made: the agent defers the step (it goes back to pending
until the breaker may close, and its failure budget is untouched). Once the reset timeout has
passed, exactly one process at a time — the holder of a short lock in the shared state — makes a
probe call; the others keep deferring. A successful probe closes the breaker for everyone.

The shared state is a handful of keys (:class:`SharedState`): in Redis (``SAS_BREAKER_URL``, or the
broker's own Redis) read on every call, or in the state store (:mod:`sas_app.store.breakers`, with
any other broker — RabbitMQ, the embedded one) read at most every :data:`STORE_FRESH` seconds, so
that the hot path pays one indexed read per half second per process, not one per call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

import pybreaker
import redis

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a process trusts what it last read of a breaker kept in the state store.
STORE_FRESH = 0.5


class SharedState(Protocol):
    """Keys every worker process sees: Redis, or a table of the state store."""

    def get(self, key: str) -> str | None: ...
    def put(self, key: str, value: str) -> None: ...
    def incr(self, key: str) -> int: ...
    def zero(self, key: str) -> None:
        """Set ``key`` to ``"0"``, writing only if it is not already."""
        ...
    def claim(self, key: str, value: str, seconds: float) -> bool:
        """Set ``key`` unless it is set and not expired; True if this call set it."""
        ...
    def release(self, key: str) -> None: ...


class RedisState:
    def __init__(self, url: str, **tls: Any) -> None:
        """``tls``: redis-py's ``ssl_*`` options for a ``rediss://`` URL (:meth:`Settings.redis_tls`)."""
        self.redis = redis.Redis.from_url(url, socket_timeout=2, decode_responses=True, **tls)

    def get(self, key: str) -> str | None:
        return self.redis.get(key)  # type: ignore[return-value]

    def put(self, key: str, value: str) -> None:
        self.redis.set(key, value)

    def incr(self, key: str) -> int:
        return int(self.redis.incr(key))

    def zero(self, key: str) -> None:
        self.redis.set(key, "0")

    def claim(self, key: str, value: str, seconds: float) -> bool:
        return bool(self.redis.set(key, value, nx=True, px=int(seconds * 1000)))

    def release(self, key: str) -> None:
        self.redis.delete(key)


class LocalState:
    """This process's own keys: a breaker nobody else sees (an agent built without a shared state)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[str, float | None]] = {}

    def get(self, key: str) -> str | None:
        value, until = self.values.get(key, (None, None))
        return value if until is None or until > time.monotonic() else None

    def put(self, key: str, value: str) -> None:
        self.values[key] = (value, None)

    def incr(self, key: str) -> int:
        value = int(self.get(key) or 0) + 1
        self.put(key, str(value))
        return value

    def zero(self, key: str) -> None:
        self.put(key, "0")

    def claim(self, key: str, value: str, seconds: float) -> bool:
        if self.get(key) is not None:
            return False
        self.values[key] = (value, time.monotonic() + seconds)
        return True

    def release(self, key: str) -> None:
        self.values.pop(key, None)


class BreakerOpen(Exception):
    """The agent's breaker is open (or another process is probing): retry after ``delay`` s.
    ``fault``: the failure that opened it, when this call's was that one."""

    def __init__(self, agent: str, delay: float, fault: BaseException | None = None) -> None:
        super().__init__(f"circuit breaker of agent {agent!r} is open; retry in {delay:.1f}s")
        self.delay = delay
        self.fault = fault


class _Storage(pybreaker.CircuitBreakerStorage):
    """pybreaker's state in :class:`SharedState` keys, each read trusted for ``fresh`` seconds.
    A success zeroes the failure count in the shared state itself (never from a cached read, so
    "failures in a row" counts across processes), writing only when it is not zero already."""

    def __init__(self, shared: SharedState, namespace: str, fresh: float) -> None:
        super().__init__(namespace)
        self._shared, self._ns, self._fresh = shared, namespace, fresh
        self._seen: dict[str, tuple[str | None, float]] = {}
        self._retrying = threading.local()  # this thread's call is an in-process retry

    @contextmanager
    def retry(self, retrying: bool) -> Iterator[None]:
        """Within: a failure is not counted when ``retrying`` (it was, at the attempt's first try)."""
        self._retrying.on = retrying
        try:
            yield
        finally:
            self._retrying.on = False

    def forget(self) -> None:
        """Read every key afresh next time."""
        self._seen.clear()

    def _read(self, key: str) -> str | None:
        value, at = self._seen.get(key, (None, -1e18))
        if time.monotonic() - at >= self._fresh:
            value = self._shared.get(f"{self._ns}:{key}")
            self._seen[key] = (value, time.monotonic())
        return value

    def _write(self, key: str, value: str) -> None:
        self._shared.put(f"{self._ns}:{key}", value)
        self._seen[key] = (value, time.monotonic())

    def _incr(self, key: str) -> None:
        self._seen[key] = (str(self._shared.incr(f"{self._ns}:{key}")), time.monotonic())

    @property
    def state(self) -> str:
        return self._read("state") or pybreaker.STATE_CLOSED

    @state.setter
    def state(self, state: str) -> None:
        self._write("state", state)

    @property
    def counter(self) -> int:
        return int(self._read("fail_counter") or 0)

    def increment_counter(self) -> None:
        if not getattr(self._retrying, "on", False):
            self._incr("fail_counter")

    def _zero(self, key: str) -> None:
        self._shared.zero(f"{self._ns}:{key}")
        self._seen[key] = ("0", time.monotonic())

    def reset_counter(self) -> None:
        self._zero("fail_counter")

    @property
    def success_counter(self) -> int:
        return int(self._read("success_counter") or 0)

    def increment_success_counter(self) -> None:
        self._incr("success_counter")

    def reset_success_counter(self) -> None:
        self._zero("success_counter")

    @property
    def opened_at(self) -> datetime | None:
        value = self._read("opened_at")
        return datetime.fromtimestamp(float(value), tz=timezone.utc) if value else None

    @opened_at.setter
    def opened_at(self, when: datetime) -> None:
        self._write("opened_at", repr(when.timestamp()))


class Breaker:
    """The breaker of one agent. ``counts(exc)`` says whether a failure is the service's fault;
    ``shared()`` opens the shared state (once per process: a forked worker opens its own); ``fresh``
    is how long a read of it is trusted."""

    def __init__(self, agent: str, fail_max: int, reset_timeout: float,
                 shared: Callable[[], SharedState], counts: Callable[[BaseException], bool],
                 fresh: float = 0.0) -> None:
        self.agent = agent
        self.fail_max = fail_max
        self.reset_timeout = reset_timeout
        self.shared = shared
        self.counts = counts
        self.fresh = fresh
        self._pid = 0
        self._lock = threading.Lock()
        self._breaker: pybreaker.CircuitBreaker | None = None
        self._state: SharedState | None = None
        self._storage: _Storage | None = None

    def _get(self) -> pybreaker.CircuitBreaker:
        with self._lock:
            if self._breaker is None or self._pid != os.getpid():
                self._state = self.shared()
                self._storage = _Storage(self._state, f"sas:breaker:{self.agent}", self.fresh)
                self._breaker = pybreaker.CircuitBreaker(
                    fail_max=self.fail_max, reset_timeout=self.reset_timeout, state_storage=self._storage,
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

    def call(self, fn: Callable[..., T], *args: Any, lasts: float = 0.0, counted: bool = True) -> T:
        """Call ``fn(*args)`` through the breaker; ``lasts``: the longest the call may take (a
        probe holds the probe lock that long); ``counted``: False for an in-process retry of a
        call whose failure was counted already."""
        breaker = self._get()
        state = breaker.current_state
        if state == pybreaker.STATE_CLOSED:
            return self._call(breaker, fn, *args, counted=counted)
        wait = self.open_for()
        if wait > 0:
            raise BreakerOpen(self.agent, wait)
        assert self._state is not None and self._storage is not None
        probe = f"sas:breaker:{self.agent}:probe"
        if not self._state.claim(probe, str(os.getpid()), max(self.reset_timeout, lasts + 5.0, 1.0)):
            raise BreakerOpen(self.agent, min(1.0, self.reset_timeout))
        try:
            # read the breaker afresh: another process's probe may have just closed it
            self._storage.forget()
            log.warning("agent %s: probing its service (breaker %s)", self.agent, breaker.current_state)
            return self._call(breaker, fn, *args)
        finally:
            self._state.release(probe)

    def _call(self, breaker: pybreaker.CircuitBreaker, fn: Callable[..., T], *args: Any,
              counted: bool = True) -> T:
        """``fn(*args)``, its outcome then counted by the breaker. The call itself runs outside
        the breaker: pybreaker holds its lock for the whole of a call it makes, which would run one
        call at a time in a worker of many threads. Should another thread's failures open the
        breaker meanwhile, this call's success still stands (its effect is applied)."""
        assert self._storage is not None
        try:
            result, failure = fn(*args), None
        except Exception as exc:
            result, failure = None, exc

        def outcome() -> T:
            if failure is not None:
                raise failure
            return result  # type: ignore[return-value]

        try:
            with self._storage.retry(not counted):
                return breaker.call(outcome)
        except pybreaker.CircuitBreakerError as exc:
            if failure is None:
                return result  # type: ignore[return-value]
            fault = exc.__context__  # the failure that reached the threshold
            log.error("agent %s: breaker opened after %d failed calls in a row; the last: %s", self.agent,
                      self.fail_max, fault)
            raise BreakerOpen(self.agent, self.reset_timeout, fault) from None

    @property
    def state(self) -> str:
        return str(self._get().current_state)
