"""How far an operator can trust a run's at-risk alerts, judged afterwards (a chaos or soak run).

* **Precision**: of the at-risk alerts, the share whose step attempt then did miss its
  complete-by (the Supervisor gave it up as expired, or it was received past it and run all the
  same: :func:`ran_late`). An alert for a step that finished in time
  cried wolf.
* **Recall**: of the step attempts that missed their complete-by *waiting in their agent's queue*
  — the Supervisor gave the attempt up as expired, and no worker had received its message before
  its complete-by (the ``received`` lines of the agent workers' logs, on the run's one clock) — the
  share whose step had an at-risk alert first. Attempts lost another way (a worker killed or frozen
  with the message in hand, a queue emptied, a hang) are not the at-risk alert's to foresee —
  among them those a worker took and went away with (killed, frozen, shut down) before it logged
  the receipt: it was not in line if a message sent :data:`OVERTAKE_S` after it on its queue (no
  undo: those jump the line) was received before its complete-by (the queues are first in, first
  out within a priority; the chaos runs submit every order at the default one) — nor
  are those held up by an **outage** (:class:`Outage`, from the chaos run's own timeline): an
  attempt that would have been received in time but for the time the broker or PostgreSQL was
  down or refusing connections (and the workers reconnecting), its worker was frozen (SIGSTOP)
  with the message in hand, or — counted at the share of the queue's workers each took away —
  another worker was frozen, cut off from PostgreSQL, or killed or shut down until it was ready
  again, missed its complete-by with no backlog to see: the queue's workers were fewer for a
  while, which no forecast of its pace can know before. Those are counted apart
  (``missed_in_outages``), and the recall with them in it too.
* **At the margin**: how many of the wrong alerts' steps were received less than :data:`MARGIN_S`
  before their complete-by, and of the unforeseen misses less than that after it. A queue that
  works at capacity drops the messages that reach its head past their complete-by and works the
  next; which ones make it there turns on which worker frees up when, and no forecast of single
  steps is sure of it.
* **Per incident**: what an operator is told is one alert per queue and incident (the steps found
  at risk, with their count; those found by the looks after the first, together, a sweep interval
  on); here a queue's alerts recorded less than :data:`INCIDENT_GAP_S` apart are one incident (its
  queue looked at again and again while its backlog lasts). An incident cried wolf if none of its
  steps then missed; the share that did not is the incidents' precision. A step's fate at the
  margin of a queue that works at capacity is a coin toss (which of the steps that reach its head
  just in time get a worker), so the steps' precision there is bounded by the share that miss;
  the incident's is not.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sas_app.states import EXPIRED_ERROR

#: Celery's log line for a message a worker received, with its task id (run, position, attempt)
RECEIVED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Task (\S+)\[([0-9a-f]{32})-(\d+)-(\d+)\] received",
    re.MULTILINE)

Attempt = tuple[str, int, int]

#: seconds after a broker comes back before its workers take messages again (Celery reconnects)
RECONNECT_S = 2.0


#: alerts of one queue recorded less than this apart (seconds) are one incident
INCIDENT_GAP_S = 0.5
#: a step received less than this before or after its complete-by (seconds) was at the margin
MARGIN_S = 0.5
#: one queue's backlog misses less than this apart (seconds, their complete-bys) are one backlog
BACKLOG_GAP_S = 5.0

#: a message sent this long (seconds) after another on its queue and received before the other's
#: complete-by overtook it: the other was not waiting in line (publishes race by a few milliseconds)
OVERTAKE_S = 0.2

#: Celery's log line for a worker ready to take messages (after a start or a restart)
READY = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] \S+ ready\.", re.MULTILINE)


@dataclass(frozen=True)
class Outage:
    """When the broker or the database was down for everyone (``worker`` None), or one worker
    (its log's name) was away, epoch seconds; then ``share`` is the part of its queue's workers it
    was, for the messages other workers received meanwhile (the one it held in hand waited for it
    alone). ``settle``: how long after ``end`` the workers took messages again."""

    start: float
    end: float
    worker: str | None = None
    share: float = 0.0
    settle: float = RECONNECT_S


def ready_times(log: str) -> list[float]:
    """When a worker's log says it was ready (epoch seconds), in order."""
    return [stamp(at) for at in READY.findall(log)]


def stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def dispatches(event_rows: Iterable[Any]) -> dict[Attempt, tuple[float, float]]:
    """When each step attempt was dispatched, and its complete-by."""
    return {(e.run_id, e.position, e.attempt): (float(e.at), float(e.detail["complete_by"]))
            for e in event_rows if e.kind == "transition" and e.position is not None and e.detail
            and e.to_state == "running" and e.detail.get("complete_by") is not None}


def missed_attempts(event_rows: Iterable[Any], dispatched: Mapping[Attempt, tuple[float, float]],
                    ) -> dict[Attempt, tuple[float, float] | None]:
    """Step attempts the Supervisor gave up because their complete-by passed, with when each was
    dispatched and its complete-by (from ``dispatched``, :func:`dispatches`; None if no dispatch of
    it is recorded)."""
    return {(e.run_id, e.position, e.attempt): dispatched.get((e.run_id, e.position, e.attempt))
            for e in event_rows if e.kind == "transition" and e.position is not None and e.detail
            and e.from_state == "running" and (
                (e.to_state == "pending" and e.detail.get("reason") == "expired")
                or (e.to_state == "failed" and e.detail.get("error") == EXPIRED_ERROR))}


def ran_late(event_rows: Iterable[Any], dispatched: Mapping[Attempt, tuple[float, float]],
             received: Mapping[Attempt, Received]) -> dict[Attempt, tuple[float, float]]:
    """Step attempts completed though their message was first received past their complete-by:
    they missed it too, though nobody gave them up — an agent that cannot read the database's
    clock (PostgreSQL refusing new connections) runs a step from its receipt, and the Supervisor,
    refused too, has not expired it by the time it completes (a 30-minute soak's: 28 such steps,
    received 4-5 s late after a broker's outage, judged as cried wolf by the expiries alone)."""
    done = [(e.run_id, e.position, e.attempt) for e in event_rows if e.kind == "transition"
            and e.position is not None and e.from_state == "running" and e.to_state == "completed"]
    return {a: dispatched[a] for a in done if a in dispatched and a in received and received[a].at > dispatched[a][1]}


class Received(NamedTuple):
    """A worker's first receipt of a step attempt's message."""

    #: epoch seconds, the logs' clock
    at: float
    #: the worker (its log's name)
    worker: str
    #: the queue it was taken from (the task ``sas.agent.warehouse.ship`` is ``sas.agent.warehouse``'s)
    queue: str


def first_received(logs: Mapping[str, str]) -> dict[Attempt, Received]:
    """When, by which worker and from which queue each step attempt's message was first received."""
    first: dict[Attempt, Received] = {}
    for worker, text in logs.items():
        for when, task, run_id, position, attempt in RECEIVED.findall(text):
            at = stamp(when)
            key = (run_id, int(position), int(attempt))
            if key not in first or at < first[key].at:
                first[key] = Received(at, worker, task.rsplit(".", 1)[0])
    return first


def backlogs(misses: Iterable[Attempt], queue_of: Mapping[Attempt, str],
             due: Mapping[Attempt, float]) -> list[list[Attempt]]:
    """``misses`` grouped into backlogs: one queue's misses whose complete-bys (``due``) are less
    than :data:`BACKLOG_GAP_S` apart."""
    groups: list[list[Attempt]] = []
    last: tuple[str, float] | None = None
    for miss in sorted(misses, key=lambda m: (queue_of[m], due[m])):
        if last is None or last[0] != queue_of[miss] or due[miss] - last[1] >= BACKLOG_GAP_S:
            groups.append([])
        groups[-1].append(miss)
        last = (queue_of[miss], due[miss])
    return groups


def undos(event_rows: Iterable[Any], dispatched: Mapping[Attempt, tuple[float, float]]) -> set[Attempt]:
    """Of the ``dispatched`` step attempts (:func:`dispatches`), those that undo a step (every
    dispatch of a run once it first began compensating): they jump their queue's line."""
    began: dict[str, float] = {}
    for e in event_rows:
        if e.kind == "transition" and e.position is None and e.to_state == "compensating":
            began[e.run_id] = min(float(e.at), began.get(e.run_id, float("inf")))
    return {a for a, (sent, _) in dispatched.items() if a[0] in began and sent >= began[a[0]]}


def overtaken(late: Mapping[Attempt, tuple[float, float]], dispatched: Mapping[Attempt, tuple[float, float]],
              received: Mapping[Attempt, Received], jumped: set[Attempt], outages: Sequence[Outage]) -> set[Attempt]:
    """Of the ``late`` attempts (when sent, complete-by), those a worker took and went away with
    before it logged so: a worker went away — killed, frozen, cut off or shut down (one of
    ``outages``, a worker's own) — between
    its sending and its complete-by, and a message sent :data:`OVERTAKE_S` or more after it on
    its queue, not one of those that ``jumped`` the line, was received before its complete-by —
    it was not waiting in line."""
    # per queue, the receipts of messages that kept their place, in the order they were sent
    line: dict[str, list[tuple[float, float]]] = {}
    for a, (sent, _) in dispatched.items():
        if a in received and a not in jumped:
            line.setdefault(received[a].queue, []).append((sent, received[a].at))
    for sends in line.values():
        sends.sort()
    away = [o.start for o in outages if o.worker is not None]
    out = set()
    for a, (sent, complete_by) in late.items():
        if not any(sent <= start <= complete_by for start in away):
            continue
        sends = line.get(received[a].queue, [])
        first = bisect.bisect_left(sends, (sent + OVERTAKE_S, float("-inf")))
        last = bisect.bisect_left(sends, (complete_by, float("-inf")))   # sent later: received later
        if any(at < complete_by for _, at in sends[first:last]):
            out.add(a)
    return out


def in_outage(sent: float, complete_by: float, received: Received, outages: Sequence[Outage]) -> bool:
    """Whether outages made the attempt late: the broker or the database down (and the workers
    reconnecting), or its worker frozen, for long enough of its wait — or other workers away, for
    their share of it — that without that time it would have been received by its complete-by.
    One a backlog made late anyway is the backlog's."""
    at, worker = received.at, received.worker
    lost = 0.0
    for o in outages:
        overlap = max(0.0, min(at, o.end + o.settle) - max(sent, o.start))
        lost += overlap if o.worker is None or o.worker == worker else overlap * o.share
    return lost > 0 and at - lost <= complete_by


def judge(alert_rows: Iterable[Any], event_rows: Iterable[Any], logs: Mapping[str, str], since: float = 0.0,
          outages: Sequence[Outage] = ()) -> dict[str, Any]:
    """The at-risk alerts' precision and recall (None when there was nothing to judge), with
    their counts, and when the wrong ones and the unforeseen misses happened (seconds after
    ``since``)."""
    alert_rows, event_rows = list(alert_rows), list(event_rows)
    dispatched = dispatches(event_rows)
    received = first_received(logs)
    missed = {**missed_attempts(event_rows, dispatched), **ran_late(event_rows, dispatched, received)}
    late = {a: when for a, when in missed.items()
            if when is not None and a in received and received[a].at > when[1]}
    held_up = {a for a, (sent, by) in late.items() if in_outage(sent, by, received[a], outages)}
    out_of_line = overtaken({a: when for a, when in late.items() if a not in held_up}, dispatched, received,
                            undos(event_rows, dispatched), outages)
    queued = {a: when for a, when in late.items() if a not in out_of_line}
    backlog = set(queued) - held_up
    at_risk = [(a.run_id, a.position, a.attempt) for a in alert_rows if a.kind == "at_risk"]
    right = [a for a in at_risk if a in missed]
    warned = {(run_id, position): attempt for run_id, position, attempt in sorted(at_risk, reverse=True)}

    def foreseen(misses: set[Attempt]) -> set[Attempt]:
        return {m for m in misses if (m[0], m[1]) in warned and warned[(m[0], m[1])] <= m[2]}

    warned_of = foreseen(backlog)
    # per backlog, what an operator hears of: told if any of its misses was warned of first
    told = [any(m in warned_of for m in group)
            for group in backlogs(backlog, {m: received[m].queue for m in backlog}, {m: queued[m][1] for m in backlog})]
    wrong = [a for a in at_risk if a not in missed]
    # received in time, but only just / too late, but only just
    just_in_time = [a for a in wrong if a in received and a in dispatched
                    and 0 <= dispatched[a][1] - received[a].at < MARGIN_S]
    just_late = [m for m in backlog - warned_of if received[m].at - queued[m][1] < MARGIN_S]
    # one incident per queue while its alerts come less than INCIDENT_GAP_S apart (a look records a
    # queue's alerts one after another, and looks at a backlog come several times a second)
    incidents: list[bool] = []
    last: tuple[str, float] | None = None
    for a in sorted((a for a in alert_rows if a.kind == "at_risk"), key=lambda a: float(a.at)):
        queue = a.reason.rsplit(" on ", 1)[-1]
        if last is None or last[0] != queue or float(a.at) - last[1] > INCIDENT_GAP_S:
            incidents.append(False)
        incidents[-1] = incidents[-1] or (a.run_id, a.position, a.attempt) in missed
        last = (queue, float(a.at))

    return {
        # when the alerts that cried wolf were raised, and the complete-by of each unforeseen miss
        # (the store's clock), to set beside the faults' timeline
        "wrong_at": sorted(round(a.at - since, 1) for a in alert_rows if a.kind == "at_risk"
                           and (a.run_id, a.position, a.attempt) not in missed),
        "unforeseen_at": sorted(round(queued[m][1] - since, 1) for m in backlog - warned_of),
        "alerts": len(at_risk),
        "alerts_whose_step_missed": len(right),
        "precision": round(len(right) / len(at_risk), 3) if at_risk else None,
        "incidents": len(incidents),
        "incidents_with_a_miss": sum(incidents),
        "incident_precision": round(sum(incidents) / len(incidents), 3) if incidents else None,
        "missed_waiting_in_queue": len(backlog),
        "missed_after_an_alert": len(warned_of),
        "recall": round(len(warned_of) / len(backlog), 3) if backlog else None,
        "backlogs": len(told),
        "backlogs_told": sum(told),
        "backlog_recall": round(sum(told) / len(told), 3) if told else None,
        "missed_in_outages": len(held_up),
        "recall_with_outages": round(len(foreseen(set(queued))) / len(queued), 3) if queued else None,
        "missed_other_ways": len(missed) - len(queued),
        "missed_out_of_line": len(out_of_line),
        "wrong_within_margin": len(just_in_time),
        "unforeseen_within_margin": len(just_late),
    }
