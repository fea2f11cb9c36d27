"""``sas dashboard``: a web view of the state store, beside Flower, and an operator's console.

Flower shows Celery tasks one by one; this shows what an operator of the pattern needs: runs by
state over time, runs filtered by state, workflow and key, each run's steps as a timeline
(dispatches, complete-by, completions, Supervisor recoveries, lost workers, undos) with its history
and links to each dispatch's task in Flower, the alerts, the Supervisors' heartbeats, and the
Prometheus metrics at ``/metrics``, and the runs waiting in the store. Server-rendered HTML and
inline SVG: no build step, no script.

Who uses it and with which role is :mod:`sas_app.web.people`'s: with basic-auth credentials
(the same ``user:password`` list as Flower's ``--basic-auth`` / ``FLOWER_BASIC_AUTH``) or a
reverse proxy's user header, every page but ``/healthz`` asks who you are. An approver approves or
rejects a run waiting for an event from its page (the signal's payload ``{"approved": …, "by":
<user>}``); an operator also resubmits, marks done, pauses, resumes, cancels, compensates and
reruns a run, or every run a filter selects (:mod:`sas_app.web.actions`), and reads the audit
trail; a viewer sees no button. Without credentials the dashboard only reads. Every action is in the
audit trail; the forms carry a CSRF token (Flask-WTF), signed with ``secret``
(``SAS_DASHBOARD_SECRET``; left out, a random one per process, so a form outlives neither a
restart nor a hop to another dashboard process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, abort, flash, g, get_flashed_messages, redirect, render_template, request
from flask_wtf.csrf import CSRFProtect, generate_csrf  # type: ignore[import-untyped]
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sas_app.errors import NotAllowed, SasError, UnknownRun
from sas_app.interfaces.access import require
from sas_app.states import RUN_STATES, TERMINAL_RUN_STATES, Role, RunState, StepState
from sas_app.store.observe import Observer
from sas_app.web.actions import actions, dashboard_actor
from sas_app.web.audit_page import audit_page
from sas_app.web.formatting import STATE_COLOURS, detail_text, when
from sas_app.web.metrics import MARGIN, registry_for
from sas_app.web.people import LOOPBACK, People
from sas_app.web.run_filter import RunFilter
from sas_app.web.timeline import chart, timeline
from sas_app.web.workflows import workflow_pages

if TYPE_CHECKING:
    from sas_app.app import SasApp


def create_dashboard(sas: SasApp, *, basic_auth: Sequence[tuple[str, str]] = (),
                     roles: Mapping[str, Role] | None = None, user_header: str = "",
                     proxy_addresses: Sequence[str] = LOOPBACK, flower_url: str = "", metrics_margin: float = MARGIN,
                     secret: str = "") -> Flask:
    """The dashboard's WSGI application for ``sas`` (served by ``sas dashboard`` with waitress).
    Who may do what: see :mod:`sas_app.web.people`. ``metrics_margin``: see :data:`sas_app.web.metrics.MARGIN`."""
    app = Flask(__name__)
    app.config["SECRET_KEY"] = secret or os.urandom(32)
    observer = Observer(sas.store)
    registry = registry_for(sas, metrics_margin)
    flower = flower_url.rstrip("/")
    people = People(basic_auth, roles or {}, user_header, tuple(proxy_addresses))

    @app.before_request
    def authenticate() -> Response | None:
        if request.path == "/healthz":
            return None
        who = people.identify(request)
        if isinstance(who, Response):
            return who
        g.person = who
        if request.method == "POST" and not people.known:
            return Response("acting from the dashboard needs its basic auth (sas dashboard --basic-auth) "
                            "or a proxy's user header (--user-header)\n", 403)
        return None

    CSRFProtect(app)  # after the credentials are checked: a stranger is asked for them, not for a token

    @app.after_request
    def not_in_a_frame(response: Response) -> Response:
        """No other site may frame a page (and trick an operator into clicking its buttons)."""
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
        return response

    @app.context_processor
    def helpers() -> dict[str, Any]:
        return {"when": when, "detail_text": detail_text, "colours": STATE_COLOURS, "flower": flower,
                "states": RUN_STATES, "csrf_token": generate_csrf, "person": g.person, "known": people.known,
                "can_approve": g.person.may(Role.APPROVER), "can_act": g.person.may(Role.OPERATOR)}

    @app.get("/")
    def overview() -> str:
        now = observer.now()
        window = min(max(request.args.get("window", 3600.0, type=float) or 3600.0, 60.0), 7 * 86400.0)
        interval = sas.settings.supervisor_interval
        return render_template("overview.html", counts=sas.store.count_runs_by_state(),
                               rerun=sas.store.count_errors_rerun(),
                               chart=chart(observer, now, window), supervisors=observer.supervisors(interval),
                               interval=interval, alerts=observer.alerts(10, current=True),
                               earlier=observer.count_alerts(current=False), waiting=observer.waiting(20), now=now)

    @app.get("/runs")
    def run_list() -> str:
        chosen = RunFilter.of(request.args)
        limit = min(max(request.args.get("limit", 200, type=int) or 200, 1), 1000)
        return render_template("runs.html", runs=chosen.runs(sas.store, limit), chosen=chosen,
                               workflows=observer.workflows(), limit=limit)

    @app.get("/runs/<run_id>")
    def run_page(run_id: str) -> str:
        try:
            view = sas.get_run(run_id)
        except UnknownRun:
            abort(404, f"no run with id {run_id!r}")
        now = observer.now()
        lanes, t0, t1 = timeline(view, now)
        live = view.run.process_state in (RunState.PENDING, RunState.PROCESSING)
        waiting = [s for s in view.steps if live and s.in_store and s.state == StepState.PENDING and s.not_before]
        deployed = sas.workflows.get(view.run.workflow)
        ended = view.run.process_state in TERMINAL_RUN_STATES
        rerun_steps = [s.name for s in deployed.specs] if deployed is not None and ended else []
        return render_template("run.html", view=view, lanes=lanes, t0=t0, t1=t1, now=now, rerun_steps=rerun_steps,
                               children=sas.store.children(run_id), waiting=waiting,
                               signals=sas.store.signals_of(run_id), done=get_flashed_messages())

    @app.post("/runs/<run_id>/signal")
    def send_signal(run_id: str) -> Any:
        """Approve or Reject: the signal ``{"approved": …, "by": <user>}`` for the event named."""
        decision = request.form.get("decision")
        if decision not in ("approve", "reject"):
            abort(400, f"decision must be approve or reject, got {decision!r}")
        who = dashboard_actor()
        by, event = who.name, request.form.get("event", "")
        try:
            with sas.audit.acting(who, "signal", run_id=run_id, target=f"{event}: {decision}"):
                require(who, Role.APPROVER, "answering a wait")
                receipt = sas.signal(run_id, event, {"approved": decision == "approve", "by": by}, by=by)
        except UnknownRun:
            abort(404, f"no run with id {run_id!r}")
        except NotAllowed as exc:
            return render_template("refused.html", message=str(exc), back=f"/runs/{run_id}"), 403
        except SasError as exc:
            abort(409, str(exc))
        flash(f"signal {decision}d: {receipt.status}")  # in the session, not the URL: no link can fake it
        return redirect(f"/runs/{run_id}", code=303)

    app.register_blueprint(actions(sas))
    app.register_blueprint(workflow_pages(sas))
    app.register_blueprint(audit_page(sas))

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
