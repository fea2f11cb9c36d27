"""Held orders in the chaos run: orders that wait in the store for a manager's review (the signal
``review``) and then a cooling-off sleep, while processes and servers are killed around them.

Every ``EVERY``-th order is held. Its review is sent at a random moment after submit — some before
the run reaches its wait (kept, consumed when it gets there), some twice (the second ignored),
half through the broker (the Celery task ``sas.signal``, as a producer with only the broker sends
it) and half through the Python API — and every third held order gets none, so its wait times out
and the order is undone. A careful sender tries again until the store has the signal (a broker
restart or a FLUSHALL can lose a message after it was published).

:meth:`HeldOrders.check` then reads the store: at most one signal consumed per wait and its
payload the wait's result; a signal recorded before the wait's timeout never missed; a wait with
no signal ended by its timeout (the order undone); a cooling-off sleep never woke early.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from sas_app import SasApp
from sas_app.errors import SasError
from sas_app.messaging.routing import SCHEDULER_QUEUE, SIGNAL

#: every how many orders one is held
EVERY = 7


class HeldOrders:
    def __init__(self, sas: SasApp, rng: random.Random) -> None:
        self.sas = sas
        self.rng = rng
        self.plan: dict[str, dict[str, Any]] = {}  # business key -> how its review is sent
        self.threads: list[threading.Thread] = []
        self.refused: Counter[str] = Counter()

    def is_held(self, index: int) -> bool:
        return index % EVERY == EVERY // 2

    def review(self, key: str) -> None:
        """Plan and start sending ``key``'s review (or, for every third held order, none)."""
        n = len(self.plan)
        plan = {"how": "none" if n % 3 == 2 else ("broker" if n % 2 else "python"),
                "delay": round(self.rng.uniform(0.0, 4.0), 2), "twice": self.rng.random() < 0.3,
                "payload": {"approved": True, "by": f"manager-{n}"}}
        self.plan[key] = plan
        if plan["how"] != "none":
            thread = threading.Thread(target=self._send, args=(key, plan), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _send(self, key: str, plan: dict[str, Any]) -> None:
        time.sleep(plan["delay"])
        for _ in range(2 if plan["twice"] else 1):
            self._send_once(key, plan)

    def _send_once(self, key: str, plan: dict[str, Any]) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if plan["how"] == "python":
                    self.sas.signal(workflow="held_order", business_key=key, event="review", payload=plan["payload"],
                                    by="chaos")
                    return
                run = self.sas.store.find_run("held_order", key)
                before = len(self.sas.store.signals_of(run.id)) if run else 0
                self.sas.celery.send_task(SIGNAL, queue=SCHEDULER_QUEUE, kwargs={
                    "workflow": "held_order", "business_key": key, "event": "review",
                    "payload": plan["payload"], "by": "chaos-broker"})
                wait_until = time.monotonic() + 5  # recorded by the Scheduler, or sent again
                while time.monotonic() < wait_until:
                    if run is not None and len(self.sas.store.signals_of(run.id)) > before:
                        return
                    time.sleep(0.2)
            except SasError as exc:  # the run has ended (or never existed): nothing to approve
                self.refused[type(exc).__name__] += 1
                return
            except Exception:  # the broker or the database is down: try again
                time.sleep(0.25)

    def check(self) -> dict[str, Any]:
        """The held orders' figures, and every broken promise of waiting and signals found."""
        wrong: list[str] = []
        counts: Counter[str] = Counter()
        for key, plan in self.plan.items():
            run = self.sas.store.find_run("held_order", key)
            if run is None:
                wrong.append(f"{key}: no run")
                continue
            steps = {s.name: s for s in self.sas.store.get_steps(run.id)}
            review, cool_off = steps["manager_review"], steps["cool_off"]
            signals = self.sas.store.signals_of(run.id)
            consumed = [s for s in signals if s.status == "consumed"]
            counts.update(s.status for s in signals)
            counts[f"run {run.process_state}"] += 1
            if len(consumed) > 1:
                wrong.append(f"{key}: {len(consumed)} signals consumed by one wait")
            if consumed and (review.state != "completed" or review.result != consumed[0].payload):
                wrong.append(f"{key}: a consumed signal is not its wait's result ({review.state}, {review.result})")
            timed_out = review.state == "failed" and "signal came within" in (review.error or "")
            counts["timed out"] += timed_out
            if timed_out and any(s.received_at < (review.not_before or 0) for s in signals):
                wrong.append(f"{key}: timed out although a signal came before its timeout")
            if plan["how"] == "none" and (signals or run.process_state == "processed"):
                wrong.append(f"{key}: never signalled, yet {run.process_state} with {len(signals)} signal(s)")
            if cool_off.state == "completed" and (cool_off.completed_at or 0) < (cool_off.not_before or 0):
                wrong.append(f"{key}: its cooling-off woke {cool_off.not_before - cool_off.completed_at:.3f} s early")
        return {"held": len(self.plan), "never_signalled": sum(p["how"] == "none" for p in self.plan.values()),
                "sent_twice": sum(p["twice"] and p["how"] != "none" for p in self.plan.values()),
                "outcomes": dict(sorted(counts.items())), "refused_signals": dict(self.refused), "wrong": wrong}
