"""An in-process broker pump: the app's queues on kombu's in-memory transport, each message's task
run in this process — the real handlers, the real serialisation, no worker.

After each message it checks the promise every publish keeps: none of the runs the message names
is left live with nothing due in the store (:meth:`Store.stranded_runs`). A message published
with a countdown is held until the store's clock has moved that far (:meth:`Pump.run_due`), as a
worker would hold it. :meth:`Pump.lose` drops messages of one kind, as a broker may."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from queue import Empty
from typing import TYPE_CHECKING, Any

from sas_app.messaging.publishes import HEADER

if TYPE_CHECKING:
    from sas_app.app import SasApp


@dataclass(frozen=True)
class Message:
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, Any]
    #: the broker's priority it was published with (None: none)
    priority: int | None = None

    def run_ids(self) -> list[str]:
        """The runs the message is about (a Scheduler's message, an agent's, a reply)."""
        named = self.kwargs.get("run_id") or self.kwargs.get("run_ids") or (self.args[0] if self.args else None)
        if isinstance(named, str):
            return [named]
        return [run_id for run_id in named or () if isinstance(run_id, str)]

    def countdown(self) -> float:
        """Seconds until its ETA, as a worker would hold it: 0 without one; with one, at least a
        millisecond, so that a message published with a countdown waits for the clock to move even
        when its ETA passed on this host's clock while the store's clock stood still."""
        eta = self.headers.get("eta")
        return max(datetime.fromisoformat(eta).timestamp() - time.time(), 0.001) if eta else 0.0


class Pump:
    """Reads the app's queues on a real kombu broker (``memory://``) and runs each message's task
    body in this process (see the module's docstring). ``on_error`` (the environment's) is given
    each exception a task raises that is not an ``Exception`` (a worker's death, a stub run out),
    and what it returns is raised in its place. With ``keep_open`` each queue's reader stays open
    from one read to the next, until :meth:`close`."""

    def __init__(self, sas: SasApp, on_error: Callable[[Message, BaseException], BaseException | None] | None = None,
                 *, keep_open: bool = False) -> None:
        self.sas = sas
        self.on_error = on_error
        #: keep one reader a queue open until :meth:`close` (a reader made for each read otherwise)
        self.keep_open = keep_open
        self._conn: Any = None
        self._readers: dict[str, Any] = {}
        #: kinds of message (:class:`Publish` values) still to drop, and how many of each
        self.to_lose: dict[str, int] = {}
        #: the kinds of the messages dropped so far, in order
        self.lost: list[str] = []
        #: messages published with a countdown, held until the store's clock reaches their time
        #: (:meth:`run_due`)
        self.held: list[tuple[float, Message]] = []

    def lose(self, kind: str, times: int = 1) -> None:
        """Drop the next ``times`` messages of ``kind`` (their ``sas_publish`` header) unrun."""
        self.to_lose[kind] = self.to_lose.get(kind, 0) + times

    def _dropped(self, message: Message) -> bool:
        kind = str(message.headers.get(HEADER))
        if not self.to_lose.get(kind, 0):
            return False
        self.to_lose[kind] -= 1
        self.lost.append(kind)
        return True

    def queues(self) -> list[str]:
        return self.sas.queues()

    def drain(self, queue: str) -> list[Any]:
        """Remove and return every message waiting on ``queue`` (kombu's messages, JSON only)."""
        if self.keep_open:
            return self._drain(self._open(queue))
        with self.sas.celery.connection_for_read() as conn:
            simple = conn.SimpleQueue(queue, no_ack=True, accept=["json"])
            try:
                return self._drain(simple)
            finally:
                simple.close()

    @staticmethod
    def _drain(simple: Any) -> list[Any]:
        drained = []
        while True:
            try:
                drained.append(simple.get(block=False))
            except Empty:
                return drained

    def _open(self, queue: str) -> Any:
        """The queue's reader, kept open from one read to the next (``keep_open``)."""
        if queue not in self._readers:
            if self._conn is None:
                self._conn = self.sas.celery.connection_for_read()
            self._readers[queue] = self._conn.SimpleQueue(queue, no_ack=True, accept=["json"])
        return self._readers[queue]

    def close(self) -> None:
        """Close the readers kept open."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._conn is not None:
            self._conn.release()
            self._conn = None

    def take(self, queue: str) -> list[Message]:
        """Remove and return every task message waiting on ``queue`` without running it."""
        taken = []
        for raw in self.drain(queue):
            args, kwargs, _ = raw.decode()
            taken.append(Message(raw.headers["task"], list(args), dict(kwargs), dict(raw.headers),
                                 raw.properties.get("priority")))
        return taken

    def purge(self) -> None:
        for queue in self.queues():
            self.take(queue)

    def execute(self, message: Message) -> None:
        task = self.sas.celery.tasks[message.task]
        # the request a worker gives the task: what it reads of its own message (its kwargs as sent)
        task.push_request(id=message.headers.get("id"), args=message.args, kwargs=message.kwargs,
                          retries=message.headers.get("retries") or 0, headers=message.headers)
        try:
            task.run(*message.args, **message.kwargs)
        except Exception:
            raise
        except BaseException as exc:
            if self.on_error is None:
                raise
            raised = self.on_error(message, exc)
            if raised is not None:
                raise raised from None
        finally:
            task.pop_request()

    def _execute_checked(self, message: Message) -> None:
        """:meth:`execute`, then the promise checked for the runs it names."""
        self.execute(message)
        stranded = self.sas.store.stranded_runs(among=message.run_ids())
        assert not stranded.count, f"after {message.task}: run {stranded.example} is live with nothing due"

    def run_due(self, limit: int = 1000) -> int:
        """:meth:`run` as a worker does it: a message published with a countdown (a back-off) is
        held until the store's clock has moved that far, and run by a later call. Returns how
        many ran."""
        ran = 0
        while ran < limit:
            now = self.sas.store.now()
            for message in (m for q in self.queues() for m in self.take(q)):
                self.held.append((now + message.countdown(), message))
            due = [m for at, m in self.held if at <= now]
            if not due:
                return ran
            self.held = [(at, m) for at, m in self.held if at > now]
            for message in due:
                if not self._dropped(message):
                    self._execute_checked(message)
                    ran += 1
        raise AssertionError(f"still busy after {limit} messages: a message loop?")

    def next_held(self) -> float | None:
        """When the soonest message held for its countdown is due (the store's clock)."""
        return min((at for at, _ in self.held), default=None)

    def run(self, queues: Iterable[str] | None = None, limit: int = 1000) -> int:
        """Run messages until the given queues (default: all) are empty; return how many ran."""
        chosen = list(queues or self.queues())
        ran = 0
        while ran < limit:
            batch = [m for q in chosen for m in self.take(q)]
            if not batch:
                return ran
            for message in batch:
                if self._dropped(message):
                    continue
                self._execute_checked(message)
                ran += 1
        raise AssertionError(f"still busy after {limit} messages: a message loop?")
