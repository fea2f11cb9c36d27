"""A run's timeline (each step's attempts on one time axis) and the overview's chart (runs
submitted over time, stacked by the state each is in now), laid out for the templates' SVG."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sas_app.engine.graph import Graph
from sas_app.interfaces.client import RunView
from sas_app.messaging.routing import dispatch_task_id
from sas_app.states import RUN_STATES, Cause, EventKind, StepState
from sas_app.store.observe import Observer
from sas_app.web.formatting import STATE_COLOURS, after_text, does, when


@dataclass
class Segment:
    """One attempt of one step on the run's timeline."""

    attempt: int
    start: float
    end: float | None
    complete_by: float | None
    outcome: str  # running | completed | recovered | lost | failed | deferred | cancelled
    label: str
    task_id: str
    x: float = 0.0
    width: float = 0.0
    deadline_x: float | None = None


@dataclass
class Lane:
    position: int
    name: str
    agent: str
    state: str
    #: a branch of the ``for_each`` step listed above it
    branch: bool = False
    #: the steps it waits for, and its condition
    after: str = ""
    #: why it was skipped, or why it failed
    note: str = ""
    segments: list[Segment] = field(default_factory=list)


def timeline(view: RunView, now: float, width: float = 600.0) -> tuple[list[Lane], float, float]:
    """Each step's attempts, from its dispatch events to what ended them, laid out on one axis:
    steps that ran side by side overlap in time. Lanes in outline order (a step, then its branches)."""
    graph = Graph(view.steps)
    lanes = {
        s.position: Lane(s.position, s.name, does(s), s.state, branch,
                         "" if branch or s.is_undo else after_text(graph.waits_for_names(s), s),
                         note=s.error if s.state in (StepState.SKIPPED, StepState.FAILED) and s.error else "")
        for s, branch in graph.outline()
    }
    open_: dict[int, Segment] = {}
    for e in view.events:
        if e.kind != EventKind.TRANSITION or e.position is None or e.position not in lanes:
            continue
        detail = e.detail if isinstance(e.detail, dict) else {}
        started = _opened(view.id, e.position, e.to_state, e.attempt or 0, e.at, detail)
        if started is not None:
            lanes[e.position].segments.append(started)
            open_[e.position] = started
            continue
        segment = open_.pop(e.position, None) if e.from_state in ("running", "pending") else None
        if segment is None:
            continue
        segment.end = e.at
        if e.to_state == StepState.COMPLETED and not segment.task_id:
            segment.outcome, segment.label = "completed", f"{segment.label}: completed"
        elif e.to_state == StepState.COMPLETED:
            segment.outcome, segment.label = "completed", f"attempt {segment.attempt} completed"
        elif e.to_state == StepState.PENDING and detail.get("reason") == Cause.EXPIRED:
            segment.outcome = "recovered"
            segment.label = (f"attempt {segment.attempt} passed its complete-by: Supervisor recovery, "
                             f"retry after {detail.get('backoff', 0):.1f}s")
        elif e.to_state == StepState.PENDING and detail.get("reason") == Cause.SILENT:
            segment.outcome = "recovered"
            segment.label = (f"attempt {segment.attempt} passed its complete-by with no word from its agent "
                             f"(its message lost?): sent again after {detail.get('backoff', 0):.1f}s, "
                             "no failure counted")
        elif e.to_state == StepState.PENDING and detail.get("reason") == Cause.WORKER_LOST:
            segment.outcome = "lost"
            segment.label = f"attempt {segment.attempt}: its worker died; retry after {detail.get('backoff', 0):.1f}s"
        elif e.to_state == StepState.PENDING and "escalated" in detail:
            segment.outcome = "recovered"
            segment.label = (f"attempt {segment.attempt} at its failure threshold: escalated, retry after "
                             f"waiting {detail.get('wait', 0):g} s")
        elif e.to_state == StepState.PENDING:
            segment.outcome = "deferred"
            segment.label = f"attempt {segment.attempt} deferred (breaker open, or at its rate limit)"
        elif e.to_state == StepState.FAILED:
            segment.outcome, segment.label = "failed", f"attempt {segment.attempt} failed: {detail.get('error', '')}"
        else:
            segment.outcome, segment.label = "cancelled", f"attempt {segment.attempt} ended: {e.to_state}"
    starts = [seg.start for lane in lanes.values() for seg in lane.segments]
    ends = [seg.end or now for lane in lanes.values() for seg in lane.segments]
    t0 = min(starts, default=view.run.created_at)
    t1 = max([*ends, t0 + 0.001])
    scale = width / (t1 - t0)
    for lane in lanes.values():
        for seg in lane.segments:
            seg.x = (seg.start - t0) * scale
            seg.width = max(((seg.end or now) - seg.start) * scale, 2.0)
            if seg.complete_by is not None and t0 <= seg.complete_by <= t1:
                seg.deadline_x = (seg.complete_by - t0) * scale
    return list(lanes.values()), t0, t1


def _opened(run_id: str, position: int, to_state: str | None, attempt: int, at: float,
            detail: dict[str, Any]) -> Segment | None:
    """The bar a step's event starts, if it starts one: a dispatched attempt (its Celery task
    linked), or — with no task — a fan-out (its branches are the lanes below), a child run (a run of
    its own), a durable sleep or a wait for an event (its timeout the red tick)."""
    if to_state == StepState.RUNNING and "branches" in detail:
        return Segment(attempt, at, None, None, "running", f"fanned out to {detail['branches']} branches", "")
    if to_state == StepState.RUNNING and "child" in detail:
        return Segment(attempt, at, None, None, "running", f"child run {detail['child']}", "")
    if to_state == StepState.PENDING and "sleep_until" in detail:
        return Segment(attempt, at, None, None, "running", f"asleep until {when(detail['sleep_until'])}", "")
    if to_state == StepState.PENDING and "wait_until" in detail:
        return Segment(attempt, at, None, detail["wait_until"], "running",
                       f"waiting for {detail['event']!r} until {when(detail['wait_until'])}", "")
    if to_state == StepState.RUNNING:
        return Segment(attempt, at, None, detail.get("complete_by"), "running", f"attempt {attempt} dispatched",
                       dispatch_task_id(run_id, position, attempt))
    return None


def chart(observer: Observer, now: float, window: float, buckets: int = 60, width: float = 900.0,
          height: float = 180.0) -> dict[str, Any]:
    """Runs submitted per bucket over the window, stacked by the state each is in now."""
    bucket = window / buckets
    since = now - window
    per: dict[int, dict[str, int]] = {}
    for index, state, count in observer.submitted_over_time(since, bucket):
        per.setdefault(min(index, buckets - 1), {})[state] = count
    tallest = max((sum(c.values()) for c in per.values()), default=0) or 1
    bar = width / buckets
    rects = []
    for index, counts in sorted(per.items()):
        y = height
        for state in RUN_STATES:
            n = counts.get(state, 0)
            if not n:
                continue
            h = n / tallest * (height - 10)
            y -= h
            rects.append({"x": index * bar, "y": y, "w": max(bar - 1, 1), "h": h, "state": state, "count": n,
                          "colour": STATE_COLOURS[state], "at": when(since + index * bucket)})
    return {"rects": rects, "width": width, "height": height, "tallest": tallest, "window": window,
            "bucket": bucket, "since": when(since), "until": when(now)}
