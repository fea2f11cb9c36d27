"""Which running steps will likely miss their complete-by waiting in their agent's queue.

The Supervisor warns an operator before a backlog costs attempts. A warning for a step that then
finishes in time is a false alarm, and alarms that cry wolf get muted, so the forecast models the
queue instead of comparing every step with the queue's whole depth:

* **Which steps wait.** A queue is first in, first out: of an agent's running steps, the last
  ``depth`` dispatched are the ones whose messages still wait (the broker's message count); the
  others are being worked on, or their messages were lost (the Supervisor recovers those at their
  complete-by; no backlog is to blame).
* **When each will be taken.** Workers take the head of the queue at the pace the agent has kept
  lately (its completions a second); a message found past its complete-by is dropped unworked, at
  no cost, so a step behind many doomed ones is not doomed with them.
* **How sure.** A step is at risk when it would be taken past its complete-by even if the agent
  worked a quarter faster than it has been (:data:`SLACK`): a step that only just misses at the
  measured pace is a coin toss, and a coin toss is not worth an operator's attention.

With no completion lately the queue is not draining at all (its workers are down or stuck, or a
burst has just begun): a waiting step is at risk once it has used half its budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .store.rows import StepRow

#: How much faster than its measured pace an agent is assumed to work before a step is called at
#: risk. The pace is a recent average; the workers' real pace varies around it, and a forecast
#: made at the average is wrong about half the steps it puts at the margin.
SLACK = 0.25


@dataclass(frozen=True)
class Risk:
    """A step that will likely miss its complete-by in its queue."""

    step: StepRow
    #: messages ahead of it in the queue (0: at its head)
    ahead: int
    #: when a worker will likely take its message (the store's clock), None if the queue is not draining
    taken_at: float | None

    @property
    def reason(self) -> str:
        step = self.step
        if self.taken_at is None:
            return (f"step {step.name!r} is likely to miss its complete-by: {self.ahead} message(s) ahead of it "
                    "and its agent completed nothing lately")
        late = self.taken_at - (step.complete_by or self.taken_at)
        return (f"step {step.name!r} is likely to miss its complete-by: taken about {late:.1f}s past it, "
                f"{self.ahead} message(s) ahead of it")


def at_risk(queued: Sequence[StepRow], now: float, per_second: float) -> list[Risk]:
    """The steps of ``queued`` (whose messages wait in one queue, its head first) that will likely
    be taken past their complete-by, when the queue drains ``per_second`` messages a second."""
    risks: list[Risk] = []
    pace = per_second * (1 + SLACK)
    taken_at = now
    for ahead, step in enumerate(queued):
        complete_by = step.complete_by if step.complete_by is not None else now
        if pace <= 0:
            if now <= complete_by < now + step.timeout / 2:
                risks.append(Risk(step, ahead, None))
            continue
        if taken_at <= complete_by:  # worked; a message found past its complete-by is dropped at once
            taken_at += 1.0 / pace
        elif complete_by >= now:
            risks.append(Risk(step, ahead, taken_at))
    return risks
