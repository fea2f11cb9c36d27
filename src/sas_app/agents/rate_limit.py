"""A rate limit per agent that holds across the whole fleet: ``sas.agent("payment",
rate_limit="20/s")`` lets every worker process together call the payment service at most 20
times a second, however many workers consume its queue.

Each call of the service first reserves a time slot in a shared schedule (:class:`Slots`): the
schedule keeps the time the next free slot starts, slots ``1/rate`` seconds apart, and a
reservation takes the first free one and moves that time on by one slot — one atomic operation, in
Redis (a short Lua script, on Redis's own clock) or in the state store (one UPSERT, on the
database's clock), as for the circuit breakers. The process then sleeps until its slot and calls.
Calls are so spaced evenly, never in a burst: the service sees at most the limit in any second.

A slot further off than the call can wait (a tenth of the time left to its step, at most
:data:`MAX_WAIT`: the rest is the call's, as its step's timeout promised) is not reserved: the
agent defers the step instead (back to pending, no failure counted), so that a long backlog of
calls waits in the store, not in worker processes. A refused call takes a turn in a line the
schedule keeps beside its slots (a second key, moved on by one slot per refusal), and its step
comes back a little before that turn: a burst far past the limit is deferred about once a step.
(New calls still take free slots as they come, so under a steady load past the limit a step may
be turned away again, and calls are not strictly in order.) A slot reserved by a call that then
does not happen (its process died) is simply unused: the limit errs on the slow side. Turns
nobody comes back for (their runs cancelled) are forgotten as soon as the schedule is idle.

With ``key`` an agent limits each key separately — each tenant, say: ``rate_limit_key=lambda call:
call.payload["tenant"]`` gives every tenant its own 20 a second.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis

from sas_app.errors import WorkflowDefinitionError
from sas_app.settings import calls_per_second
from sas_app.store.rate_limits import PREFIX, line_of

#: the longest a call sleeps in its worker for its slot; past it the step is deferred
MAX_WAIT = 5.0


def per_second(limit: str) -> float:
    """``"20/s"``, ``"100/m"``, ``"5/h"`` or ``"20"`` (per second) as calls per second, as Celery
    writes rate limits; a limit that is not one of those, or not above zero, is refused."""
    value = calls_per_second(limit)
    if value <= 0:
        raise WorkflowDefinitionError(
            f"rate limit {limit!r} is not a positive rate: write it as calls per second, minute or hour, "
            "e.g. '20/s', '100/m', '5/h'")
    return value


class Slots(Protocol):
    """The shared schedule of calls: Redis, the state store, or this process's own."""

    def reserve(self, key: str, interval: float, horizon: float) -> tuple[bool, float]:
        """Reserve the first free slot under ``key`` (slots ``interval`` seconds apart) if it
        starts within ``horizon`` seconds. Returns whether it was reserved, and how many seconds
        from now it starts (0: now; the schedule was idle, and its line is dropped). When it is
        later no slot is reserved: the call takes the next turn in the key's line of refused calls
        (turns ``interval`` apart, none before the first free slot), and the seconds are until that
        turn."""
        ...


# KEYS[1]: the key, KEYS[2]: its line of refused calls; ARGV: interval, horizon (seconds). Returns
# {reserved 0/1, wait as a string} (Lua numbers reach Redis as integers). Each key lives as long
# as its schedule runs ahead.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, horizon = tonumber(ARGV[1]), tonumber(ARGV[2])
local free = tonumber(redis.call('GET', KEYS[1]) or '0')
local at = math.max(free, now)
if at - now > horizon then
  local turn = math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), at)
  local after = turn + interval
  redis.call('SET', KEYS[2], string.format('%.6f', after), 'PX', math.ceil((after - now) * 1000) + 1000)
  return {0, tostring(turn - now)}
end
if free <= now then
  redis.call('DEL', KEYS[2])
end
redis.call('SET', KEYS[1], string.format('%.6f', at + interval), 'PX', math.ceil((at + interval - now) * 1000) + 1000)
return {1, tostring(at - now)}
"""


class RedisSlots:
    """The schedule in Redis, one key per limit, on Redis's clock."""

    def __init__(self, url: str, **tls: Any) -> None:
        """``tls``: redis-py's ``ssl_*`` options for a ``rediss://`` URL (:meth:`Settings.redis_tls`)."""
        self.redis = redis.Redis.from_url(url, socket_timeout=2, decode_responses=True, **tls)
        self.script = self.redis.register_script(_RESERVE)

    def reserve(self, key: str, interval: float, horizon: float) -> tuple[bool, float]:
        reserved, wait = self.script(keys=[key, line_of(key)], args=[repr(interval), repr(horizon)])
        return bool(int(reserved)), max(float(wait), 0.0)


class LocalSlots:
    """This process's own schedule: a limit nobody else shares (an agent built without one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.free: dict[str, float] = {}

    def reserve(self, key: str, interval: float, horizon: float) -> tuple[bool, float]:
        now = self.clock()
        at = max(self.free.get(key, now), now)
        if at - now > horizon:
            turn = max(self.free.get(line_of(key), at), at)
            self.free[line_of(key)] = turn + interval
            return False, turn - now
        if at == now:  # idle: a line left from a burst is stale
            self.free.pop(line_of(key), None)
        self.free[key] = at + interval
        return True, at - now


class RateLimited(Exception):
    """This call was not made: no slot came soon enough, or the shared schedule could not be read
    (calling anyway could break the limit). The step is deferred ``delay`` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class RateLimit:
    """One agent's limit: ``limit`` (Celery's notation) shared through ``slots()`` (opened once
    per process, as a forked worker needs its own connection), per ``key(call)`` when given."""

    def __init__(self, agent: str, limit: str, slots: Callable[[], Slots],
                 key: Callable[[Any], object] | None = None) -> None:
        self.agent = agent
        self.limit = limit
        self.interval = 1.0 / per_second(limit)
        self.slots = slots
        self.key = key
        self._opened: tuple[int, Slots] | None = None

    def _slots(self) -> Slots:
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = (os.getpid(), self.slots())
        return self._opened[1]

    def name(self, call: Any) -> str:
        """The schedule ``call`` takes its slot in: the agent's, or its key's (a long key hashed)."""
        if self.key is None:
            return f"{PREFIX}{self.agent}"
        key = str(self.key(call))
        if len(key) > 64:
            key = hashlib.sha256(key.encode()).hexdigest()
        return f"{PREFIX}{self.agent}:{key}"

    def wait(self, call: Any, remaining: float) -> float:
        """Reserve ``call``'s slot: the seconds to sleep before calling. Raises
        :class:`RateLimited` when no slot starts within a tenth of ``remaining`` (and
        :data:`MAX_WAIT`), or when the schedule cannot be read."""
        name = self.name(call)
        horizon = max(min(remaining / 10, MAX_WAIT), 0.0)
        try:
            reserved, wait = self._slots().reserve(name, self.interval, horizon)
        except Exception as exc:  # Redis or the store unreachable
            raise RateLimited(f"agent {self.agent!r}: its rate limit of {self.limit} cannot be checked ({exc})",
                              1.0) from exc
        if not reserved:
            # back a little before its turn, so that the turn's slot is within what it may wait;
            # spread by a fraction of a slot, never past the turn after it
            delay = max(wait - horizon / 2, 0.0) + random.uniform(0, min(self.interval, horizon) / 4)
            raise RateLimited(f"agent {self.agent!r} is at its rate limit of {self.limit}; "
                              f"retry in {delay:.1f}s", delay)
        return wait
