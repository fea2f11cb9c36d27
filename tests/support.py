"""Helpers shared by the unit and integration tests: bounded waits and an in-process message pump."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from queue import Empty
from typing import Any, TypeVar

from sas_app import SasApp

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class Message:
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, Any]


class Pump:
    """Reads the app's queues on a real kombu broker (``memory://`` in unit tests) and runs each
    message's task body in this process: the real handlers, the real serialisation, no workers."""

    def __init__(self, sas: SasApp) -> None:
        self.sas = sas

    def queues(self) -> list[str]:
        return self.sas.queues()

    def take(self, queue: str) -> list[Message]:
        """Remove and return every message waiting on ``queue`` without running it."""
        taken: list[Message] = []
        with self.sas.celery.connection_for_read() as conn:
            simple = conn.SimpleQueue(queue, no_ack=True, accept=["json"])
            try:
                while True:
                    try:
                        raw = simple.get(block=False)
                    except Empty:
                        break
                    args, kwargs, _ = raw.decode()
                    taken.append(Message(raw.headers["task"], list(args), dict(kwargs), dict(raw.headers)))
            finally:
                simple.close()
        return taken

    def purge(self) -> None:
        for queue in self.queues():
            self.take(queue)

    def execute(self, message: Message) -> None:
        self.sas.celery.tasks[message.task].run(*message.args, **message.kwargs)

    def run(self, queues: Iterable[str] | None = None, limit: int = 1000) -> int:
        """Run messages until the given queues (default: all) are empty; return how many ran."""
        chosen = list(queues or self.queues())
        ran = 0
        while ran < limit:
            batch = [m for q in chosen for m in self.take(q)]
            if not batch:
                return ran
            for message in batch:
                self.execute(message)
                ran += 1
        raise AssertionError(f"still busy after {limit} messages: a message loop?")
