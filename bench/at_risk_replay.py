"""The Supervisor's at-risk forecast replayed on a chaos or soak run's record, to weigh a change of
it against what then happened without running the stack again (a 30-minute soak per try).

    python -m bench.chaos --soak 30m --rate 5 --keep --home /tmp/soak
    python -m bench.at_risk_replay /tmp/soak

A run kept with ``--keep`` leaves what its judge read (:data:`bench.chaos.JUDGED`): the steps'
transitions, their completions, the agent workers' logs and the faults' outages. From them this
rebuilds, once a look's interval (``--every``, the run's SAS_AT_RISK_INTERVAL), what the Supervisor
saw of each agent's queue — its depth (the messages sent and not yet received, from the workers'
``received`` lines), the running steps whose messages those likely are (the last dispatched, as
``SweepTx.queued_steps`` reads them) and the agent's recent completions — asks
:mod:`sas_app.supervision.forecast.queue_model`
which of them are at risk, raises an alert once per step (as the Supervisor does: a step warned of
is not warned of again on a later attempt), and judges those alerts as the run's own were judged
(:func:`bench.alert_quality.judge`). The run's own alerts are judged beside them: the replay of the
code the run ran should come close (its looks were not always on time; a killed Supervisor or a
slow look skipped some). Where a look falls within its interval matters — a queue's pace read a
moment before or after a worker comes back differs — so the replay is run at several phases of
the interval and averaged (``--phases``); and then at the run's own looks, as its Supervisor's
worker logged them (``look at …`` lines: the chaos run sets
SAS_DEBUG_LOGS=sas_app.supervision.forecast.watch), each start
of the worker knowing only what its own looks saw: a restarted Supervisor takes none until it is
ready, and its looks come late when its host is busy. Where the run's alerts and the replay's at
its own looks part, the forecast read the queues otherwise than the record rebuilds them; where
the replay's at its own looks and at regular ones part, the looks were to blame.
"""

from __future__ import annotations

import argparse
import pickle
import re
import sys
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil, inf
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from bench import alert_quality
from bench.chaos import AT_RISK_INTERVAL, JUDGED
from sas_app.messaging.routing import agent_queue
from sas_app.supervision.forecast import queue_model as backlog

#: the at-risk window and the completions a look reads (Settings.at_risk_window, recent_completions)
WINDOW_S = 60.0
MOST = 50


@dataclass(frozen=True)
class Waiting:
    """A step attempt whose message was sent to its agent's queue: what the forecast reads of it
    (as of a ``StepRow``), and when it was received and left running."""

    run_id: str
    position: int
    attempt: int
    name: str
    timeout: float
    complete_by: float
    sent: float
    received: float | None
    ended: float


#: which of an agent's waiting steps (head first) are at risk at ``now``, given its completions
#: (newest first, within the window, at most MOST), how often the queue is looked at, since
#: when the Supervisor has seen the queues and the spans between two looks that found it shorter
Forecaster = Callable[[Sequence[Waiting], float, list[float], float, float, list[tuple[float, float]]],
                      list[Waiting]]


def as_of_today(queued: Sequence[Waiting], now: float, completed: list[float], every: float,
                seen_since: float, taken: list[tuple[float, float]]) -> list[Waiting]:
    """What sas_app.supervision.forecast.queue_model says today (sas_app.supervision.forecast.watch)."""
    per_second = backlog.draining(completed, now, head=queued[0],  # type: ignore[arg-type]
                                  seen_since=seen_since, taken=taken)
    if per_second is None:
        return []
    risks = backlog.forecast(queued, now, per_second, every=every,  # type: ignore[arg-type]
                             former=backlog.former_pace(completed, now))
    return [r.step for r in risks]  # type: ignore[misc]


FORECASTERS: dict[str, Forecaster] = {"as of today": as_of_today}


class Record:
    """A kept run's record, indexed for asking what each queue held at any moment."""

    def __init__(self, home: Path) -> None:
        with open(home / JUDGED, "rb") as f:
            self.data: dict[str, Any] = pickle.load(f)
        d = self.data
        self.events = [SimpleNamespace(**e) for e in d["events"]]
        received = alert_quality.first_received(d["logs"])
        steps = {(s["run_id"], s["position"]): s for s in d["steps"]}
        ended: dict[tuple[str, int, int], float] = {}  # when each attempt first left running
        for e in self.events:
            if e.position is not None and e.from_state == "running":
                ended.setdefault((e.run_id, e.position, e.attempt), float(e.at))
        self.by_agent: dict[str, list[Waiting]] = {}
        for key, (_, by) in alert_quality.dispatches(self.events).items():
            step = steps.get(key[:2])
            if step is None or step.get("compensates") is not None:
                continue
            got = received.get(key)
            self.by_agent.setdefault(step["agent"], []).append(Waiting(
                *key, name=step["name"], timeout=float(step["timeout"]), complete_by=by,
                sent=by - float(step["timeout"]), received=got.at if got else None,
                ended=ended.get(key, float("inf"))))
        for waiting in self.by_agent.values():
            waiting.sort(key=lambda w: w.sent)
        self.sent_at = {a: [w.sent for w in ws] for a, ws in self.by_agent.items()}
        self.received_at = {a: sorted(w.received for w in ws if w.received is not None)
                            for a, ws in self.by_agent.items()}
        self.sent_then_received = {a: sorted(w.sent for w in ws if w.received is not None)
                                   for a, ws in self.by_agent.items()}
        self.completed = {a: sorted(s["completed_at"] for s in d["steps"]
                                    if s["agent"] == a and s["completed_at"] is not None)
                          for a in self.by_agent}
        self.start = min(w.sent for ws in self.by_agent.values() for w in ws)
        self.end = max(w.sent for ws in self.by_agent.values() for w in ws) + 10
        # A message no worker received waited in its queue until the broker was emptied (a FLUSHALL,
        # a purge: the run's timeline) — left out, a chaos run's backlog just before a FLUSHALL
        # replayed a third as deep as the Supervisor read it — unless a message sent after it was
        # received first: then it was not in line (its publish failed, or a worker took it and died)
        emptied = sorted(d["started_at"] + t["at"] + t.get("took_s", 0.0)
                         for t in d.get("timeline", ()) if t["kind"] in ("empty_broker", "operator_pause"))
        self.lost_sent: dict[str, list[float]] = {}
        self.lost_at: dict[str, list[float]] = {}
        for agent, ws in self.by_agent.items():
            # the first receipt of a message sent at or after each one's sending (they are in sent order)
            first_after = [inf] * (len(ws) + 1)
            for i in range(len(ws) - 1, -1, -1):
                got = ws[i].received
                first_after[i] = min(first_after[i + 1], inf if got is None else got)
            lost = [(w.sent, min(first_after[bisect_left(self.sent_at[agent], w.sent + alert_quality.OVERTAKE_S)],
                                 next((at for at in emptied if at > w.sent), self.end)))
                    for w in ws if w.received is None]
            self.lost_sent[agent] = sorted(sent for sent, _ in lost)
            self.lost_at[agent] = sorted(gone for _, gone in lost)

    def depth(self, agent: str, now: float) -> int:
        """How many messages wait in ``agent``'s queue at ``now``: sent and not yet received (or, of
        those never received, not yet lost with the broker's contents)."""
        return (bisect_right(self.sent_then_received[agent], now) - bisect_right(self.received_at[agent], now)
                + bisect_right(self.lost_sent[agent], now) - bisect_right(self.lost_at[agent], now))

    def queue(self, agent: str, now: float, depth: int | None = None, read_at: float | None = None) -> list[Waiting]:
        """The running steps whose messages likely wait in ``agent``'s queue at ``now``, head first:
        as many of the last dispatched as messages were sent and not yet received — or as
        ``depth`` says, read at ``read_at`` (as the Supervisor counts them: the last dispatched by
        then)."""
        depth = self.depth(agent, now) if depth is None else depth
        if depth <= 0:
            return []
        waiting = self.by_agent[agent]
        found: list[Waiting] = []
        for i in range(bisect_right(self.sent_at[agent], now if read_at is None else read_at) - 1, -1, -1):
            w = waiting[i]
            if w.ended > now:
                found.append(w)
                if len(found) == depth:
                    break
            elif now - w.sent > 120:
                break
        return found[::-1]

    def completions(self, agent: str, now: float) -> list[float]:
        done = self.completed[agent]
        hi = bisect_right(done, now)
        lo = bisect_right(done, now - WINDOW_S)
        return done[max(lo, hi - MOST):hi][::-1]


#: the log of the chaos run's worker that takes the Supervisor's looks
SUPERVISOR_LOG = Path("logs") / "supervisor.log"
#: a look the Supervisor took, in its worker's log (the chaos run sets
#: SAS_DEBUG_LOGS=sas_app.supervision.forecast.watch):
#: when it judged and when it read the queues (the store's clock), and what it read; or when it
#: logged finding no message waiting; and each start of the worker (:class:`sas_app.testing.processes.Processes`
#: writes one such line a start)
LOOKED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): DEBUG/MainProcess\] look"
                    r"(?: at ([0-9.]+) \(queues read at ([0-9.]+)\): (.*)|: no message waits)$|^(--- start )",
                    re.MULTILINE)
#: a queue with messages waiting, in such a line
READ = re.compile(r"(\w+) (\d+) waiting")


class Look(NamedTuple):
    """A look at the queues: when (the store's clock), by which process (what it saw before goes
    with it), and — a run's own — the depths it read and when (else the record's are taken)."""

    at: float
    process: str = ""
    depths: dict[str, int] | None = None
    read_at: float | None = None


def own_looks(log: str) -> list[Look]:
    """The looks the run's Supervisor worker took, from that worker's log: when each judged, what
    it read and when, and which start of the worker took it (``"1"``, ``"2"``, …: a worker
    restarted knows nothing of what it saw before); skipped looks (another was taken just
    before) are not looks, and one that found no message waiting read every queue empty."""
    looks: list[Look] = []
    starts = 0
    for stamped, at, read_at, found, started in LOOKED.findall(log):
        if started:
            starts += 1
        elif at:
            looks.append(Look(float(at), str(starts), {agent: int(n) for agent, n in READ.findall(found)},
                              float(read_at)))
        else:
            looks.append(Look(alert_quality.stamp(stamped), str(starts), {}))
    return looks


def replay(record: Record, forecaster: Forecaster, phase: float = 0.0, every: float = AT_RISK_INTERVAL,
           looks: Sequence[Look] | None = None) -> list[SimpleNamespace]:
    """The at-risk alerts ``forecaster`` would have raised, once a look (``phase`` seconds after
    the first dispatch, and ``every`` seconds after; or at ``looks``, the run's own, each by the
    start of the worker that took it, with what it read: :func:`own_looks`), each step once — on
    the first attempt found at risk, as the Supervisor's alerts are deduplicated (replayed once
    per attempt, a step's later attempts, most of them missed after the first had, added right
    alerts the run could not raise: a quarter more in a 1,500-order run). No look reads a queue
    while the broker or the database is down: the Supervisor's read of a queue's depth then
    finds nothing (or it cannot look at all), so the run raised no alert then either — replayed,
    the messages sent before such an outage looked like a backlog, and every one of them missed:
    alerts the run could not raise, right ones, and a precision above the run's. After one, the
    Supervisor has seen the queues since its end. Each process notes, as the Supervisor's do, the
    spans between two of its looks that found a queue getting shorter."""
    if looks is None:
        n = ceil((record.end - record.start - phase) / every)
        looks = [Look(record.start + phase + i * every) for i in range(n)]
    alerts: dict[tuple[str, int], SimpleNamespace] = {}
    # per process: each queue's depth at its last look (and when), and the spans it got shorter in
    depth_at: dict[str, dict[str, tuple[float, int]]] = {}
    taken: dict[str, dict[str, deque[tuple[float, float]]]] = {}
    down = [(o.start, o.end) for o in record.data["outages"] if o.worker is None]
    for now, process, read, read_at in looks:
        if not record.start <= now < record.end:
            continue
        seen, shorter = depth_at.setdefault(process, {}), taken.setdefault(process, {})
        if any(start <= now <= end for start, end in down):  # unread: nothing to go by after it
            seen.clear()
            shorter.clear()
            continue
        seen_since = max((end for _, end in down if end < now), default=record.start)
        for agent in record.by_agent:
            depth = record.depth(agent, now) if read is None else read.get(agent, 0)
            if depth <= 0:
                seen.pop(agent, None)
                shorter.pop(agent, None)
                continue
            recent = shorter.setdefault(agent, deque())
            backlog.note_shorter(recent, seen.get(agent), depth, now, WINDOW_S)
            seen[agent] = (now, depth)
            queued = record.queue(agent, now, depth, read_at)
            if not queued:
                continue
            for step in forecaster(queued, now, record.completions(agent, now), every, seen_since, list(recent)):
                key = (step.run_id, step.position)
                if key not in alerts:
                    alerts[key] = SimpleNamespace(kind="at_risk", run_id=key[0], position=key[1], attempt=step.attempt,
                                                  at=now, reason=f"at risk on {agent_queue(agent)}")
    return list(alerts.values())


def judged(record: Record, alerts: list[Any]) -> dict[str, Any]:
    d = record.data
    verdict = alert_quality.judge(alerts, record.events, d["logs"], since=d["started_at"], outages=d["outages"])
    return {k: verdict[k] for k in ("alerts", "precision", "recall", "missed_waiting_in_queue", "backlog_recall",
                                    "incidents", "incident_precision", "recall_with_outages", "wrong_within_margin",
                                    "unforeseen_within_margin")}


def mean_of(verdicts: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Each figure of ``verdicts`` (:func:`judged`) averaged over those that have it."""
    mean: dict[str, float | None] = {}
    for key in verdicts[0]:
        known = [v[key] for v in verdicts if v[key] is not None]
        mean[key] = round(sum(known) / len(known), 3) if known else None
    return mean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.at_risk_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("home", type=Path, help="a chaos run's home folder, kept with --keep")
    parser.add_argument("--every", type=float, default=AT_RISK_INTERVAL,
                        help=f"seconds between looks at the queues (default {AT_RISK_INTERVAL}, the chaos run's)")
    parser.add_argument("--phases", type=int, default=4,
                        help="replay with looks this many fractions of their interval apart, averaged: which "
                             "moment a look happens to see a queue moves a run's figures by a few points (default 4)")
    args = parser.parse_args(argv)
    record = Record(args.home)
    log = args.home / SUPERVISOR_LOG
    looks = own_looks(log.read_text(errors="replace")) if log.exists() else []
    own = [SimpleNamespace(**a) for a in record.data["alerts"]]
    print(f"the run's own alerts: {judged(record, own)}")
    for name, forecaster in FORECASTERS.items():
        verdicts = [judged(record, replay(record, forecaster, phase=i * args.every / args.phases, every=args.every))
                    for i in range(args.phases)]
        print(f"{name}, looked at every {args.every:g} s, mean of {args.phases} phases: {mean_of(verdicts)}",
              flush=True)
        print(f"  precision / recall by phase: {[(v['precision'], v['recall']) for v in verdicts]}")
        if looks:
            own_verdict = judged(record, replay(record, forecaster, looks=looks))
            print(f"{name}, at the run's own {len(looks)} looks: {own_verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
