"""How far an operator can trust a run's at-risk alerts, judged afterwards (a chaos or soak run).

* **Precision**: of the at-risk alerts, the share whose step attempt then did miss its
  complete-by (the Supervisor gave it up as expired). An alert for a step that finished in time
  cried wolf.
* **Recall**: of the step attempts that missed their complete-by *waiting in their agent's queue*
  — the Supervisor gave the attempt up as expired, and no worker had received its message before
  its complete-by (the ``received`` lines of the agent workers' logs, on the run's one clock) — the
  share whose step had an at-risk alert first. Attempts lost another way (a worker killed or frozen
  with the message in hand, a queue emptied, a hang) are not the at-risk alert's to foresee.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sas_app.states import EXPIRED_ERROR

#: Celery's log line for a message a worker received, with its task id (run, position, attempt)
RECEIVED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Task \S+\[([0-9a-f]{32})-(\d+)-(\d+)\] received",
    re.MULTILINE)

Attempt = tuple[str, int, int]


def missed_attempts(event_rows: Iterable[Any]) -> dict[Attempt, float | None]:
    """Step attempts the Supervisor gave up because their complete-by passed, with that complete-by
    (None if no dispatch of it is recorded)."""
    complete_by: dict[Attempt, float] = {}
    missed: dict[Attempt, float | None] = {}
    for e in event_rows:
        if e.kind != "transition" or e.position is None or not e.detail:
            continue
        attempt = (e.run_id, e.position, e.attempt)
        if e.to_state == "running" and e.detail.get("complete_by") is not None:
            complete_by[attempt] = float(e.detail["complete_by"])
        elif e.from_state == "running" and (
                (e.to_state == "pending" and e.detail.get("reason") == "expired")
                or (e.to_state == "failed" and e.detail.get("error") == EXPIRED_ERROR)):
            missed[attempt] = complete_by.get(attempt)
    return missed


def first_received(logs: Iterable[str]) -> dict[Attempt, float]:
    """When a worker first received each step attempt's message (epoch seconds, the logs' clock)."""
    first: dict[Attempt, float] = {}
    for text in logs:
        for stamp, run_id, position, attempt in RECEIVED.findall(text):
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            key = (run_id, int(position), int(attempt))
            first[key] = min(first.get(key, at), at)
    return first


def judge(alert_rows: Iterable[Any], event_rows: Iterable[Any], logs: Iterable[str], since: float = 0.0
          ) -> dict[str, Any]:
    """The at-risk alerts' precision and recall (None when there was nothing to judge), with
    their counts, and when the wrong ones and the unforeseen misses happened (seconds after
    ``since``)."""
    alert_rows = list(alert_rows)
    missed = missed_attempts(event_rows)
    received = first_received(logs)
    backlog = {a for a, by in missed.items() if by is not None and a in received and received[a] > by}
    at_risk = [(a.run_id, a.position, a.attempt) for a in alert_rows if a.kind == "at_risk"]
    right = [a for a in at_risk if a in missed]
    warned = {(run_id, position): attempt for run_id, position, attempt in sorted(at_risk, reverse=True)}
    foreseen = {m for m in backlog if (m[0], m[1]) in warned and warned[(m[0], m[1])] <= m[2]}
    return {
        # when the alerts that cried wolf were raised, and the complete-by of each unforeseen miss
        # (the store's clock), to set beside the faults' timeline
        "wrong_at": sorted(round(a.at - since, 1) for a in alert_rows if a.kind == "at_risk"
                           and (a.run_id, a.position, a.attempt) not in missed),
        "unforeseen_at": sorted(round((missed[m] or 0.0) - since, 1) for m in backlog if m not in foreseen),
        "alerts": len(at_risk),
        "alerts_whose_step_missed": len(right),
        "precision": round(len(right) / len(at_risk), 3) if at_risk else None,
        "missed_waiting_in_queue": len(backlog),
        "missed_after_an_alert": len(foreseen),
        "recall": round(len(foreseen) / len(backlog), 3) if backlog else None,
        "missed_other_ways": len(missed) - len(backlog),
    }
