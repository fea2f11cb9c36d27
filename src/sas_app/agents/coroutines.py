"""Actions written as ``async def``: each worker thread keeps one event loop and runs a coroutine
action on it, cancelled when its step's complete-by comes.

One loop per thread, kept from one step to the next, so a client an action keeps (an
``httpx.AsyncClient``, a connection pool) stays bound to the loop it was made on. A prefork worker
runs one step at a time per process, as for a plain action; ``-P threads -c N`` runs N at once,
each thread on its own loop — the pool for many I/O-bound steps in one worker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import TypeVar

from sas_app.errors import StepExpired

T = TypeVar("T")

_local = threading.local()


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, made on first use and kept."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    return loop


def run_bounded(awaitable: Awaitable[T], timeout: float, step: str) -> T:
    """Run ``awaitable`` to its end on this thread's loop, or cancel it once ``timeout`` seconds
    have passed and raise :class:`StepExpired`: a hung call stops holding the worker's slot. An
    exception of its own (its own time-out included) is raised as it is."""

    async def bounded() -> T:
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # let it run its clean-up
            raise StepExpired(step)
        return task.result()

    return thread_loop().run_until_complete(bounded())
