"""``sas dashboard``: a read-only web view of the state store, beside Flower.

Flower shows Celery tasks one by one; this shows what an operator of the pattern needs: runs by
state over time, runs filtered by state, workflow and key, each run's steps as a timeline
(dispatches, complete-by, completions, Supervisor recoveries, lost workers, undos) with its history
and links to each dispatch's task in Flower, the alerts, the Supervisors' heartbeats, and the
Prometheus metrics at ``/metrics``. Server-rendered HTML and inline SVG: no build step, no script.
It only reads; with basic-auth credentials (the same ``user:password`` list as Flower's
``--basic-auth`` / ``FLOWER_BASIC_AUTH``) every page but ``/healthz`` asks for them.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, abort, render_template, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .agent import dispatch_task_id
from .client import when
from .errors import UnknownRun
from .metrics import MARGIN, registry_for
from .models import RUN_STATES
from .store import EXPIRED_REASON, WORKER_LOST
from .store.observe import Observer

if TYPE_CHECKING:
    from .app import SasApp
    from .client import RunView

STATE_COLOURS = {
    "pending": "#9aa5b1", "processing": "#3b82f6", "processed": "#16a34a", "error": "#dc2626",
    "compensating": "#f59e0b", "compensated": "#a16207", "cancelled": "#6b7280",
}


def parse_basic_auth(spec: str) -> list[tuple[str, str]]:
    """``"user:password[,user:password…]"``, as Flower's ``--basic-auth`` takes it."""
    pairs = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise ValueError("basic auth must be user:password[,user:password...]")
        pairs.append((user, password))
    return pairs


#: detail fields holding an epoch time (by the database's clock)
EPOCH_FIELDS = frozenset({"complete_by"})


def detail_text(detail: Any) -> str:
    """An event's detail for people: ``key: value`` pairs, epoch times as UTC times."""
    if not detail:
        return ""
    if not isinstance(detail, dict):
        return str(detail)
    parts = []
    for key, value in detail.items():
        if key in EPOCH_FIELDS and isinstance(value, (int, float)):
            value = when(value)
        parts.append(f"{key}: {value}")
    return ", ".join(parts)


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
    segments: list[Segment] = field(default_factory=list)


def timeline(view: RunView, now: float, width: float = 600.0) -> tuple[list[Lane], float, float]:
    """Each step's attempts, from its dispatch events to what ended them, laid out on one axis."""
    lanes = {s.position: Lane(s.position, s.name, f"{s.agent}.{s.action}", s.state) for s in view.steps}
    open_: dict[int, Segment] = {}
    for e in view.events:
        if e.kind != "transition" or e.position is None or e.position not in lanes:
            continue
        detail = e.detail if isinstance(e.detail, dict) else {}
        if e.to_state == "running":
            started = Segment(e.attempt or 0, e.at, None, detail.get("complete_by"), "running",
                              f"attempt {e.attempt} dispatched", dispatch_task_id(view.id, e.position, e.attempt or 0))
            lanes[e.position].segments.append(started)
            open_[e.position] = started
            continue
        segment = open_.pop(e.position, None) if e.from_state == "running" else None
        if segment is None:
            continue
        segment.end = e.at
        if e.to_state == "completed":
            segment.outcome, segment.label = "completed", f"attempt {segment.attempt} completed"
        elif e.to_state == "pending" and detail.get("reason") == EXPIRED_REASON:
            segment.outcome = "recovered"
            segment.label = (f"attempt {segment.attempt} passed its complete-by: Supervisor recovery, "
                             f"retry after {detail.get('backoff', 0):.1f}s")
        elif e.to_state == "pending" and detail.get("reason") == WORKER_LOST:
            segment.outcome = "lost"
            segment.label = f"attempt {segment.attempt}: its worker died; retry after {detail.get('backoff', 0):.1f}s"
        elif e.to_state == "pending":
            segment.outcome, segment.label = "deferred", f"attempt {segment.attempt} deferred (breaker open)"
        elif e.to_state == "failed":
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
    return sorted(lanes.values(), key=lambda lane: lane.position), t0, t1


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


def create_dashboard(sas: SasApp, *, basic_auth: Sequence[tuple[str, str]] = (), flower_url: str = "",
                     metrics_margin: float = MARGIN) -> Flask:
    """The dashboard's WSGI application for ``sas`` (served by ``sas dashboard`` with waitress).
    ``metrics_margin``: see :data:`sas_app.metrics.MARGIN`."""
    app = Flask(__name__)
    observer = Observer(sas.store)
    registry = registry_for(sas, metrics_margin)
    flower = flower_url.rstrip("/")

    @app.before_request
    def authenticate() -> Response | None:
        if not basic_auth or request.path == "/healthz":
            return None
        given = request.authorization
        if given is not None and given.type == "basic" and any(
            hmac.compare_digest(str(given.username), user) and hmac.compare_digest(str(given.password), password)
            for user, password in basic_auth
        ):
            return None
        return Response("credentials required\n", 401, {"WWW-Authenticate": 'Basic realm="sas dashboard"'})

    @app.context_processor
    def helpers() -> dict[str, Any]:
        return {"when": when, "detail_text": detail_text, "colours": STATE_COLOURS, "flower": flower,
                "states": RUN_STATES}

    @app.get("/")
    def overview() -> str:
        now = observer.now()
        window = min(max(request.args.get("window", 3600.0, type=float) or 3600.0, 60.0), 7 * 86400.0)
        return render_template("overview.html", counts=sas.store.count_runs_by_state(),
                               chart=chart(observer, now, window), supervisors=observer.supervisors(),
                               alerts=observer.alerts(10, current=True), now=now)

    @app.get("/runs")
    def run_list() -> str:
        state = request.args.get("state") or None
        if state is not None and state not in RUN_STATES:
            abort(400, f"unknown state {state!r}; one of {', '.join(RUN_STATES)}")
        workflow = request.args.get("workflow") or None
        key = request.args.get("key") or None
        limit = min(max(request.args.get("limit", 200, type=int) or 200, 1), 1000)
        rows = sas.store.list_runs(state=state, workflow=workflow, key=key, limit=limit)
        return render_template("runs.html", runs=rows, state=state, workflow=workflow, key=key or "",
                               workflows=observer.workflows(), limit=limit)

    @app.get("/runs/<run_id>")
    def run_page(run_id: str) -> str:
        try:
            view = sas.get_run(run_id)
        except UnknownRun:
            abort(404, f"no run with id {run_id!r}")
        now = observer.now()
        lanes, t0, t1 = timeline(view, now)
        return render_template("run.html", view=view, lanes=lanes, t0=t0, t1=t1, now=now)

    @app.get("/alerts")
    def alert_list() -> str:
        return render_template("alerts.html", current=observer.alerts(500, current=True),
                               earlier=observer.alerts(200, current=False))

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app
