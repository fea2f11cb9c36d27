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
  has not shown its workers' pace. Nor is one younger than that after a stall with fewer than
  :data:`SETTLED` completions: workers come back from an outage one by one, and the first
  completions are the first workers' — but workers held up by hanging calls come back together,
  and their queue must still be judged soon.
* **When each is taken.** Workers take the head first; a message found past its complete-by is
  dropped unworked, at a small cost (:data:`DROPPED_S`), so a step behind many doomed ones is not
  doomed with them — nor reached at once.
* **How sure, how far ahead.** A forecast further ahead is less sure: a queue's workers change
  within seconds (one restarting is back, one frozen thaws, another agent's hanging steps hold the
  pool processes they share), and at the margin of a queue working at capacity, which steps just
  make it turns on which worker frees up first. So a step is judged in two ways. Once the last
  fifth of its budget has begun (:data:`JUDGED_WITHIN`), it is at risk if it would miss even were
  its agent three times as fast as its pace (:data:`SURELY`): surely late, told early. In its last look
  (:data:`LAST_LOOKS`: its complete-by before the Supervisor's next look at its queue,
  SAS_AT_RISK_INTERVAL away, a fraction of a second), it is at risk if it would miss at the pace
  itself, its head taken when a worker frees up (:data:`HEAD_WAIT`): a coin toss a second ahead,
  seldom wrong that near.

How each constant was chosen, with the replays behind it: docs/explanation/at-risk-forecast.md
(``python -m bench.at_risk_replay`` measures them).

With no completion for a while the queue is not draining at all (its workers are down or stuck):
it is judged as if they came back now at their former pace — stalls are mostly short — and, with
no pace known, a waiting step is at risk once it is that near its complete-by.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from math import inf

from sas_app.store.rows import StepRow

#: A gap between two completions longer than this, in seconds (and than ten times the median gap),
#: is a stall or an idle spell, not the agent's pace. (Concurrent workers complete in bursts: the
#: median gap alone can be a hundredth of the mean.)
STALL_S = 0.5
#: How much faster than its measured pace an agent is assumed to work when pacing retries (when a
#: message sent now would be taken): sent a little early rather than late, so the queue never runs
#: dry while they wait.
SLACK = 0.25
#: A step is at risk before its last look only if it would miss even were its agent this much
#: faster than its pace (three times as fast): the forecast further ahead is less sure — a queue's
#: pace read just after an outage or a worker's restart can be half what its workers do a second
#: later, and agents sharing cores take turns at them — and a step that misses only at the pace
#: itself is a coin toss there, decided at its last look instead.
SURELY = 2.0
#: A step is judged at its pace itself once its complete-by comes within this many looks at its
#: queue (SAS_AT_RISK_INTERVAL apart): its last, when a forecast a fraction of a second ahead is
#: seldom wrong.
LAST_LOOKS = 1
#: The head of a busy queue is taken when a worker frees up, this many messages' time from now,
#: not at once (the pace counts dropped messages, each a few milliseconds; a worker frees up when
#: its step is done).
HEAD_WAIT = 3.0
#: A backlog is not judged before it is this old (or half its head's timeout, if less), unless its
#: workers have completed three steps since it began: what they can do is not known before. After
#: a stall, not before its drain is this old unless it has completed :data:`SETTLED`.
SETTLE_S = 2.0
#: Completions after a stall that are a pace to go by before :data:`SETTLE_S`: workers back from an
#: outage come back one by one, and the first few completions are the first ones'.
SETTLED = 10
#: A step is judged before its last looks once less than this share of its timeout is left.
JUDGED_WITHIN = 1 / 5
#: What a message found past its complete-by still costs its queue, in seconds: dropped unworked,
#: it is still received, checked against the database's clock and acknowledged; counted as free,
#: a step behind hundreds of doomed messages would be forecast to be taken at once.
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


def draining(completed: Sequence[float], now: float, head: StepRow, seen_since: float = -inf,
             taken: Iterable[tuple[float, float]] = ()) -> float | None:
    """The pace at which the queue whose oldest waiting message is ``head``'s is being drained, from
    its agent's recent completions (newest first): those since ``head``'s message was sent (the
    queue never empty since) and since its workers last stalled — a broker's or a database's
    outage, workers frozen or restarting: what they do once back is their pace, not the silence
    (:func:`pace`, which leaves idle spells out), once all of them are back (:data:`SETTLE_S`).
    Workers that complete nothing while the queue is seen getting shorter (``taken``: the spans
    between two looks, the second of which found fewer messages waiting) have not stalled: they
    are dropping a run of messages past their complete-by. 0.0 while they have completed nothing
    for a while (not draining); None while this drain is too young to say — or, silent, while the
    one asking has seen the queues for less than that (since ``seen_since``: it has just started,
    or the broker or the database was down for it too, and the workers reconnect as it did)."""
    since = (head.complete_by or now) - head.timeout
    drained = [at for at in completed if at >= since]
    stall = stall_after([a - b for a, b in pairwise(drained)])
    # when its workers were at work: each completion, each span in which the queue got shorter
    busy = sorted([(at, at) for at in drained] + [(max(a, since), b) for a, b in taken if b >= since])
    stalled = False
    at_work = -inf
    for start, end in busy:
        if start - at_work > stall and at_work > -inf:  # a stall: this drain began when it ended
            stalled, since = True, start
        at_work = max(at_work, end)
    drained = [at for at in drained if at >= since]
    # too young to say: a burst just sent with fewer than three completions, or workers back from a
    # stall with fewer than SETTLED — they come back one by one, each reconnecting to the broker and
    # the database in its own time, and the first completions are the first workers' pace
    if now - since < min(SETTLE_S, head.timeout / 2) and len(drained) < (SETTLED if stalled else 3):
        return None
    per_second = pace(drained, now)
    quiet = now - (drained[0] if drained else since)
    if per_second <= 0 or quiet > max(SETTLE_S, 3.0 / per_second):
        return None if now - seen_since < min(SETTLE_S, head.timeout / 2) else 0.0
    return per_second


def note_shorter(taken: deque[tuple[float, float]], before: tuple[float, int] | None, depth: int, now: float,
                 window: float) -> None:
    """Note in ``taken`` (the spans in which a queue was seen getting shorter, oldest first) the one
    since ``before`` (the last look at the queue: when, the depth it read) if ``depth``, read
    ``now``, is less — up to :data:`SETTLE_S` long: looks further apart may have an outage between
    them — and forget those older than ``window`` seconds (what :func:`draining` reads as
    ``taken``)."""
    if before is not None and depth < before[1] and now - before[0] <= SETTLE_S:
        taken.append((before[0], now))
    while taken and taken[0][1] < now - window:
        taken.popleft()


@dataclass(frozen=True)
class Risk:
    """A step that will likely miss its complete-by in its queue."""

    step: StepRow
    #: messages ahead of it in the queue (0: at its head)
    ahead: int
    #: when a worker will likely take its message (the store's clock), None if the queue is not draining
    taken_at: float | None
    #: the broker did not answer: nothing is taken from its queues (:func:`stranded`)
    broker_down: bool = False

    @property
    def reason(self) -> str:
        step = self.step
        said = f"step {step.name!r} is likely to miss its complete-by"
        if self.broker_down or self.taken_at is None:
            why = "the broker not answering" if self.broker_down else "its agent completed nothing lately"
            return f"{said}: {self.ahead} message(s) ahead of it and {why}"
        late = self.taken_at - (step.complete_by or self.taken_at)
        return f"{said}: taken about {late:.1f}s past it, {self.ahead} message(s) ahead of it"


def _taken(queued: Sequence[StepRow], start: float, per_second: float) -> tuple[list[float], float]:
    """When a worker takes each of ``queued`` (head first) if the queue drains ``per_second``
    messages a second from ``start`` (its head taken then), a message found past its complete-by
    dropped for :data:`DROPPED_S`; and when a message behind them all would be."""
    taken: list[float] = []
    at = start
    for step in queued:
        taken.append(at)
        at += 1.0 / per_second if step.complete_by is None or at <= step.complete_by else DROPPED_S
    return taken, at


def clear_at(queued: Sequence[StepRow], now: float, per_second: float, behind: int = 0) -> float | None:
    """When a message sent now to the queue where ``queued`` wait (head first), with ``behind``
    more after them (each taken as work to do), would be taken if it drains ``per_second``
    messages a second, a quarter (:data:`SLACK`) quicker; None if it is not draining."""
    if per_second <= 0:
        return None
    quick = per_second * (1 + SLACK)
    _, at = _taken(queued, now, quick)
    return at + behind / quick


def former_pace(completed: Sequence[float], now: float) -> float:
    """The pace an agent's workers kept before they went quiet (its completions ``completed``,
    newest first, from a recent window: :func:`pace`, stalls left out), once three completions
    say it; 0.0 before."""
    return pace(completed, now) if len(completed) >= 3 else 0.0


def forecast(queued: Sequence[StepRow], now: float, per_second: float, every: float = 0.0,
             former: float = 0.0) -> list[Risk]:
    """Which of ``queued`` (the steps whose messages wait in one queue, its head first) will likely
    be taken past their complete-by when the queue drains ``per_second`` messages a second. The
    queue is looked at again ``every`` seconds: a step is at risk once the last fifth of its budget
    (or ``every``) is left if it would miss even at three times that pace (:data:`SURELY`), and in its
    last look (:data:`LAST_LOOKS`) if it would miss at that pace, its head taken a few messages'
    time from now (:data:`HEAD_WAIT`).

    A queue not draining (``per_second`` 0) is judged as if its workers came back now at the pace
    they kept before (``former``, :func:`former_pace`): its steps are at risk if they would miss
    even so — stalls are mostly short, and workers back from one drain faster than before it. Of a
    queue whose pace is not known, the steps in the last fifth of their budget are at risk."""
    if per_second <= 0 and former > 0:
        return [Risk(risk.step, risk.ahead, None) for risk in forecast(queued, now, former, every)]
    if per_second <= 0:  # not draining, its pace unknown: the steps in the last part of their budget
        return [Risk(step, ahead, None) for ahead, step in enumerate(queued)
                if now <= (step.complete_by if step.complete_by is not None else now)
                < now + max(step.timeout * JUDGED_WITHIN, every)]
    surely, _ = _taken(queued, now, per_second * (1 + SURELY))
    likely, _ = _taken(queued, now + HEAD_WAIT / per_second, per_second)
    risks: list[Risk] = []
    for ahead, step in enumerate(queued):
        complete_by = step.complete_by if step.complete_by is not None else now
        left = complete_by - now
        if left < 0:  # already past it: the sweep's, not a warning
            continue
        sure = left < max(step.timeout * JUDGED_WITHIN, every) and surely[ahead] > complete_by
        if sure or (left < LAST_LOOKS * every and likely[ahead] > complete_by):
            risks.append(Risk(step, ahead, likely[ahead] if likely[ahead] > complete_by else surely[ahead]))
    return risks


def stranded(queued: Sequence[StepRow], now: float, every: float) -> list[Risk]:
    """Of ``queued`` (the steps whose messages waited in one queue when the broker last answered,
    its head first), those whose complete-by comes before the look after next at it (looks are
    ``every`` seconds apart; one may come late) while the broker does not answer: nothing is taken
    from a broker that is down, and its workers reconnect some time after it is back. In its last
    look a step is judged at its queue's pace (:func:`forecast`); here there is none."""
    return [Risk(step, ahead, None, broker_down=True) for ahead, step in enumerate(queued)
            if step.complete_by is not None and now <= step.complete_by < now + (LAST_LOOKS + 1) * every]
