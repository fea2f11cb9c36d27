"""Operators among the chaos run's faults: what people do to runs while processes die around them.

* ``operator_pause`` pauses a live order, and once its steps under way have ended, stops the
  Scheduler's worker, resumes the order and empties the broker before the worker starts again: the
  resume's message is lost, as a failover loses it, and only the run's own due time brings it back;
* ``operator_mark_done`` marks a live order's ``confirm_order`` done by hand before it starts (no
  service's ledger holds a confirmation, so the order is judged by its other effects as ever);
* ``operator_cancel`` cancels a live order: what it did is undone, it ends ``cancelled``;
* ``operator_resubmit`` submits an order whose card is declined and whose first release is refused
  (it ends in ``error``), and resubmits it once it does: the release is tried again, it ends
  ``compensated``.

Each takes a live order at random (not a held or poison one, nor one already operated on), or,
when there is none, one it submits itself (counted in the run's submissions). What was done to
which order is kept in ``operated``; the run's invariants apply to these orders as to any.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import select

from harness.rabbitmq_node import RabbitNode
from harness.servers import Servers
from sas_app import InvalidOperation, SasApp
from sas_app.states import RunState, StepState
from sas_app.testing.processes import Processes

T = TypeVar("T")

KINDS = ("operator_pause", "operator_mark_done", "operator_cancel", "operator_resubmit")
#: how long a paused order stays paused before it is resumed, and at most how much longer it waits
#: for its steps under way to end (a step hung past its complete-by is given up by then)
PAUSED_S, SETTLE_S = 2.0, 10.0
#: an order that ends in error: its card declined, the release of its stock refused the first time
ENDS_IN_ERROR = {"amount": 9.0, "faults": {"charge": "permanent", "release": "permanent@1"}}
#: how long the resubmit waits for its order to reach error: as long as the run waits for its
#: orders to end (``--bound``'s default), for an overloaded run is slow to get there, not failing
ERROR_WITHIN_S = 180.0
BY = "chaos-operator"
#: orders chosen, at most, before an operator fault gives up
TRIES = 5


def _patiently(action: Callable[[], T]) -> T:
    """``action``, tried again for up to half a minute while the store or the broker is down (a
    fault of the run); a refusal (:class:`InvalidOperation`) is the caller's."""
    deadline = time.monotonic() + 30.0
    while True:
        try:
            return action()
        except InvalidOperation:
            raise
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Operators:
    """The part of :class:`bench.chaos.Chaos` that acts as an operator."""

    sas: SasApp
    fleet: Processes
    servers: Servers
    rabbit: RabbitNode | None
    rng: random.Random
    accepted: dict[str, str]
    poison_keys: list[str]
    held: Any
    background: list[threading.Thread]

    #: business key -> what an operator did to it
    operated: dict[str, str]
    operator_submitted: int

    def submit(self, key: str, payload: dict[str, Any], workflow: str = "order", reply_to: str | None = None) -> None:
        raise NotImplementedError

    def later(self, delay: float, action: Any) -> None:
        raise NotImplementedError

    def operate(self, kind: str) -> str:
        """Do ``kind`` to an order; what was done. An order that moved on between being chosen and
        being acted on (it finished, its step started) is passed over for another."""
        if kind == "operator_resubmit":
            return self._resubmit()
        for _ in range(TRIES):
            key = self._live_order(needs_not_started=kind != "operator_cancel")
            try:
                return self._act(kind, key, self.accepted[key])
            except InvalidOperation:
                continue
        raise RuntimeError(f"{kind}: every order chosen moved on first ({TRIES} tries)")

    def _act(self, kind: str, key: str, run_id: str) -> str:
        if kind == "operator_pause":
            try:
                _patiently(lambda: self.sas.pause(run_id, by=BY, reason="checking the stock"))
            except InvalidOperation:  # refused: unless a try the store dropped the answer to had paused it
                if getattr(self.sas.store.get_run(run_id), "paused_by", None) != BY:
                    raise
            self.operated[key] = kind
            return self._resume_lost(key, run_id)
        if kind == "operator_mark_done":
            _patiently(lambda: self.sas.mark_done(run_id, "confirm_order", by=BY, reason="confirmed by phone"))
            self.operated[key] = kind
            return f"{key}: confirm_order marked done"
        if kind == "operator_cancel":
            state = _patiently(lambda: self.sas.cancel(run_id, by=BY, reason="customer changed their mind"))
            self.operated[key] = kind
            return f"{key}: cancelled, now {state}"
        raise ValueError(kind)

    def _live_order(self, needs_not_started: bool) -> str:
        """A plain order processing now (with ``confirm_order`` not started, if asked), chosen at
        random; else one submitted now."""
        from sas_app.store.tables import runs, steps

        skip = set(self.operated) | set(self.poison_keys) | set(self.held.plan)
        query = select(runs.c.business_key).where(runs.c.workflow == "order",
                                                  runs.c.process_state == RunState.PROCESSING.value,
                                                  runs.c.paused_by.is_(None))
        if needs_not_started:
            query = query.join(steps, steps.c.run_id == runs.c.id).where(
                steps.c.name == "confirm_order", steps.c.state == StepState.NOT_STARTED.value)
        with self.sas.store.engine.connect() as conn:
            live = sorted(k for k in conn.execute(query).scalars() if k not in skip and k in self.accepted)
        if live:
            return self.rng.choice(live)
        self.operator_submitted += 1
        key = f"operator-{self.operator_submitted}"
        self.submit(key, {"amount": 7.0, "faults": {"reserve": "latency:1"}})
        return key

    def _resume_lost(self, key: str, run_id: str) -> str:
        """The paused order resumed while the Scheduler's worker is down, then the broker emptied
        before it starts again: the resume's message is lost (a frozen worker would not do: Redis
        hands a message to a consumer blocked in BRPOP even while its process is stopped). It waits
        for the order's steps under way to end first (at most :data:`SETTLE_S`): one completing after
        the resume would move the order on by itself."""
        time.sleep(PAUSED_S)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and self._running(run_id):
            time.sleep(0.25)
        self.fleet.kill("scheduler")
        try:
            _patiently(lambda: self.sas.resume(run_id, by=BY, reason="stock is fine"))
            emptied = f"RabbitMQ purged ({self.rabbit.purge()} ready)" if self.rabbit else "Redis FLUSHALL"
            if not self.rabbit:
                self.servers.flushall()
        finally:
            self.fleet.start("scheduler", wait=False)
        return f"{key}: paused {PAUSED_S:g}s, resumed while the Scheduler's worker was down, then {emptied}"

    def _running(self, run_id: str) -> bool:
        """Whether a step of the run is running (True, to wait on, while the store cannot say)."""
        try:
            return any(s.state == StepState.RUNNING for s in self.sas.store.get_steps(run_id))
        except Exception:
            return True

    def _resubmit(self) -> str:
        self.operator_submitted += 1
        key = f"operator-{self.operator_submitted}"
        self.operated[key] = "operator_resubmit"
        self.submit(key, dict(ENDS_IN_ERROR))

        def once_in_error() -> None:
            deadline = time.monotonic() + ERROR_WITHIN_S
            while time.monotonic() < deadline:
                try:
                    run = self.sas.store.find_run("order", key)
                    if run is not None and run.process_state == RunState.ERROR:
                        self.sas.resubmit(run.id, by=BY, reason="the warehouse is back")
                        self.operated[key] = "operator_resubmit: resubmitted"
                        return
                except Exception:  # the store restarting: look again
                    pass
                time.sleep(0.5)

        self.later(0.0, once_in_error)
        return f"{key}: submitted to end in error, resubmitted once it does"
