"""An agent's queue, modelled: which of the steps waiting in it will be taken past their
complete-by (the Supervisor's at-risk warning), and when a message sent now would be taken (its
pacing of retries).

A warning for a step that then finishes in time is a false alarm, and alarms that cry wolf get
muted; a retry sent into a queue that will not reach it in time only expires again. So both go by
the queue itself rather than its bare depth:

* **Which steps wait.** A queue is first in, first out: of an agent's running steps, the last
  ``depth`` dispatched are the ones whose messages still wait (the broker's message count); the
  others are being worked on, or their messages were lost (the Supervisor recovers those at their
  complete-by; no backlog is to blame).
* **At what pace.** The pace at which the queue is being drained (:func:`draining`): the agent's
  completions since its head's message was sent — the queue has not been empty since, so its
  workers had work all along and this is what they can do, not how often work came (an agent
  completing a step now and then before a burst is not slow) — and since its workers last
  stalled (a broker's outage, workers frozen or restarting: once back they drain at their own
  pace, and a forecast at the pace of the silence cried wolf after every outage). A drain younger
  than :data:`SETTLE_S` with fewer than three completions is not judged yet: a burst just sent
  has not shown its workers' pace. Nor is one younger than that after a stall, however many it
  completed: workers come back from an outage one by one, and the first completions are the
  first workers' (in the chaos runs replayed, alerts raised then were the soaks' wrong ones).
* **When each is taken.** Workers take the head first; a message found past its complete-by is
  dropped unworked, at a small cost (:data:`DROPPED_S`), so a step behind many doomed ones is not
  doomed with them — nor reached at once: behind 300 of them it waits a second or two more.
* **How sure.** A step is at risk when it would be taken past its complete-by even if the agent
  worked a quarter faster than its pace (:data:`SLACK`): one that only just misses is a coin toss.
  Judged at the pace itself, a saturated queue's forecast caught a tenth more of its misses (its
  errors lean late); but a soak's few backlogs after a fault were nearly all such coin tosses, and
  fell the other way — an operator told of an incident that never came stops listening, while one
  whose queue is overloaded hears of it from the steps that are surely late.
* **How far ahead.** A step's fate is judged once the last third of its budget has begun
  (:data:`JUDGED_WITHIN`; or a sweep before its complete-by, if that is sooner, so that a sweep
  sees it): a forecast further ahead is less sure. A queue's workers change within seconds (one
  restarting is back, one frozen thaws, another agent's hanging steps hold the pool processes they
  share): in a chaos run replayed, the middle 80% of steps were taken within 0.19 s of their
  forecast when it looked less than half a second ahead, within 0.71 s when it looked two seconds
  ahead. Judged two sweeps ahead, a soak replayed raised four times the wrong alerts (``python -m
  bench.at_risk_replay``; the README has the figures, before and after).

With no completion for a while the queue is not draining at all (its workers are down or stuck):
a waiting step is at risk once it is that near its complete-by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from .store.rows import StepRow

#: A gap between two completions longer than this, in seconds (and than ten times the median gap),
#: is a stall or an idle spell, not the agent's pace. (Concurrent workers complete in bursts: the
#: median gap alone can be a hundredth of the mean.)
STALL_S = 0.5
#: How much faster than its measured pace an agent is assumed to work before a step is called at
#: risk. The pace is a recent average; the workers' real pace varies around it, and a forecast
#: made at the average is wrong about half the steps it puts at the margin.
SLACK = 0.25
#: A backlog is not judged before it is this old (or half its head's timeout, if less), unless its
#: workers have completed three steps since it began: what they can do is not known before. After
#: a stall, not before its drain is this old whatever it completed: its workers come back one by one.
SETTLE_S = 2.0
#: A step is judged once less than this share of its timeout is left before its complete-by.
JUDGED_WITHIN = 1 / 3
#: What a message found past its complete-by still costs its queue, in seconds: dropped unworked,
#: it is still received, checked against the database's clock and acknowledged. Chaos runs on a
#: 2-core machine dropped up to 476 a second with six worker processes, fewer with real work
#: between them; counted as free, a step behind 300 doomed messages was forecast to be taken at
#: once and was taken two seconds late.
DROPPED_S = 0.005


def stall_after(gaps: Sequence[float]) -> float:
    """A gap between two completions longer than this is a stall or an idle spell, not the pace:
    :data:`STALL_S`, or ten times the median gap if longer."""
    return max(STALL_S, 10 * sorted(gaps)[len(gaps) // 2]) if gaps else STALL_S


def pace(completed: Sequence[float], now: float) -> float:
    """Completions a second of an agent whose last steps completed at ``completed`` (newest first,
    from a recent window) while it was completing: over the time between them, less any stall
    (:func:`stall_after`: an idle minute before a burst, a broker's restart in between), so that
    neither makes it look slow — what it can do, not what it did (an agent dropping a run of
    expired messages completes nothing meanwhile, and is not slower for it). With no gap to go by,
    its completions over the span up to ``now``."""
    if not completed:
        return 0.0
    gaps = [a - b for a, b in pairwise(completed)]
    kept = [gap for gap in gaps if gap <= stall_after(gaps)]
    if kept and sum(kept) > 0:
        return len(kept) / sum(kept)
    return len(completed) / max(now - completed[-1], 1.0)


def draining(completed: Sequence[float], now: float, head: StepRow) -> float | None:
    """The pace at which the queue whose oldest waiting message is ``head``'s is being drained, from
    its agent's recent completions (newest first): those since ``head``'s message was sent (the
    queue never empty since) and since its workers last stalled — a broker's or a database's
    outage, workers frozen or restarting: what they do once back is their pace, not the silence
    (:func:`pace`, which leaves idle spells out), once all of them are back (:data:`SETTLE_S`).
    0.0 while they have completed nothing for a while (not draining); None while this drain is
    too young to say."""
    since = (head.complete_by or now) - head.timeout
    drained = [at for at in completed if at >= since]
    gaps = [a - b for a, b in pairwise(drained)]
    stall = stall_after(gaps)
    stalled = next((i for i, gap in enumerate(gaps) if gap > stall), None)
    if stalled is not None:  # this drain began with the first completion after the stall
        drained = drained[:stalled + 1]
        since = drained[-1]
    # too young to say: a burst just sent with fewer than three completions, or workers back from a
    # stall, however many they completed — they come back one by one, each reconnecting to the
    # broker and the database in its own time, and the first completions are the first workers' pace
    if now - since < min(SETTLE_S, head.timeout / 2) and (stalled is not None or len(drained) < 3):
        return None
    per_second = pace(drained, now)
    quiet = now - (drained[0] if drained else since)
    if per_second <= 0 or quiet > max(SETTLE_S, 3.0 / per_second):
        return 0.0
    return per_second


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


@dataclass(frozen=True)
class Forecast:
    #: the waiting steps that will likely be taken past their complete-by
    risks: list[Risk] = field(default_factory=list)
    #: when a message sent now would be taken (None: the queue is not draining)
    clear_at: float | None = None


def forecast(queued: Sequence[StepRow], now: float, per_second: float, behind: int = 0,
             lead: float = 0.0) -> Forecast:
    """What becomes of ``queued`` (the steps whose messages wait in one queue, its head first)
    when the queue drains ``per_second`` messages a second; ``behind`` more messages wait after
    them, not looked at (each taken as work to do). A step is judged (:data:`JUDGED_WITHIN`) once
    it is a third of its timeout or ``lead`` seconds from its complete-by, whichever is more."""
    risks: list[Risk] = []
    quick = per_second * (1 + SLACK)
    taken_at = now
    for ahead, step in enumerate(queued):
        complete_by = step.complete_by if step.complete_by is not None else now
        judged = now <= complete_by < now + max(step.timeout * JUDGED_WITHIN, lead)
        if quick <= 0:
            if judged:
                risks.append(Risk(step, ahead, None))
            continue
        if taken_at <= complete_by:  # worked
            taken_at += 1.0 / quick
            continue
        if judged:
            risks.append(Risk(step, ahead, taken_at))
        taken_at += DROPPED_S  # found past its complete-by: dropped
    return Forecast(risks, taken_at + behind / quick if quick > 0 else None)
