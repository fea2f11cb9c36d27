"""What an operator does from the dashboard: on a run's page resubmit, mark a step done, pause,
resume, cancel, compensate and rerun; from the runs list, resubmit, cancel or rerun every run a
filter selects, after a confirmation page that says how many it will touch.

Each action is the operator's own (:mod:`sas_app.interfaces.operations`): the same rules, one
transaction per run, recorded as an ``operator`` event by the user the dashboard authenticated, and
refused with the same message as the CLI (a 409 page naming it; nothing changed). The dashboard asks for
basic auth before any of it and checks a CSRF token on every form (see :mod:`sas_app.web.dashboard`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, abort, flash, g, redirect, render_template, request
from werkzeug.datastructures import MultiDict

from sas_app.errors import NotAllowed, SasError, UnknownRun
from sas_app.interfaces.access import Actor, require
from sas_app.interfaces.audit import new_batch
from sas_app.interfaces.operations import done_message
from sas_app.states import Role, RunState
from sas_app.web.run_filter import RunFilter

if TYPE_CHECKING:
    from sas_app.app import SasApp

log = logging.getLogger(__name__)

ACTIONS = ("resubmit", "mark_done", "pause", "resume", "cancel", "compensate", "rerun")
#: What each bulk action applies to: the runs the filter selects in these states.
BULK = {"resubmit": (RunState.ERROR,), "cancel": (RunState.PENDING, RunState.PROCESSING),
        "rerun": (RunState.ERROR, RunState.COMPENSATED, RunState.CANCELLED)}
#: what each bulk action does to a run, for its confirmation page
DOES = {"resubmit": "resubmitted", "cancel": "cancelled", "rerun": "rerun from the step you name, each as a new run"}
#: At most this many runs per bulk action (the newest the filter selects).
BULK_LIMIT = 1000


def actions(sas: SasApp) -> Blueprint:
    bp = Blueprint("actions", __name__)

    @bp.post("/runs/<run_id>/act")
    def act(run_id: str) -> Any:
        action = request.form.get("action", "")
        if action not in ACTIONS:
            abort(400, f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
        try:
            said = perform(sas, run_id, action, request.form, dashboard_actor())
        except UnknownRun:
            abort(404, f"no run with id {run_id!r}")
        except NotAllowed as exc:
            return render_template("refused.html", message=str(exc), back=f"/runs/{run_id}"), 403
        except SasError as exc:
            return render_template("refused.html", message=str(exc), back=f"/runs/{run_id}"), 409
        flash(said)
        return redirect(f"/runs/{run_id}", code=303)

    @bp.get("/runs/bulk")
    def confirm_bulk() -> Any:
        operator_only()
        action = bulk_action(request.args)
        chosen = RunFilter.of(request.args)
        selected = chosen.runs(sas.store, BULK_LIMIT + 1)
        more = len(selected) > BULK_LIMIT
        selected = selected[:BULK_LIMIT]
        touched = [r for r in selected if r.process_state in BULK[action]]
        return render_template("bulk.html", action=action, chosen=chosen, selected=selected, touched=touched,
                               left=len(selected) - len(touched), more=more, limit=BULK_LIMIT,
                               states=BULK[action], does=DOES[action])

    @bp.post("/runs/bulk")
    def bulk() -> Any:
        operator_only()
        action = bulk_action(request.form)
        ids = request.form.getlist("run")
        if not ids or len(ids) > BULK_LIMIT:
            abort(400, f"a bulk {action} takes 1 to {BULK_LIMIT} runs, got {len(ids)}")
        done, refused = [], []
        batch, who = new_batch(), dashboard_actor()
        for run_id in ids:  # each its own transaction: one refused or failing leaves the others done
            try:
                done.append(perform(sas, run_id, action, request.form, who, batch))
            except SasError as exc:
                refused.append((run_id, str(exc)))
            except Exception as exc:
                log.exception("bulk %s of run %s failed", action, run_id)
                refused.append((run_id, f"failed, nothing changed: {type(exc).__name__}: {exc}"))
        return render_template("bulk_done.html", action=action, done=done, refused=refused,
                               back="/runs?" + request.form.get("filter", ""))

    return bp


def perform(sas: SasApp, run_id: str, action: str, form: MultiDict[str, str], who: Actor,
            batch: str | None = None) -> str:
    """Do ``action`` to one run as ``who``, in the audit trail; what the CLI would say once it has."""
    reason = form.get("reason", "").strip()
    step = form.get("step", "").strip() or None
    with sas.audit.acting(who, action, run_id=run_id, target=step, reason=reason, batch=batch):
        require(who, Role.OPERATOR, "acting on runs")
        return _perform(sas, run_id, action, form, who.name, reason, step)


def _perform(sas: SasApp, run_id: str, action: str, form: MultiDict[str, str], by: str, reason: str,
             step: str | None) -> str:
    if action == "resubmit":
        sas.resubmit(run_id, by=by, reason=reason, step=step, step_input=json_field(form, "input"))
    elif action == "mark_done":
        if step is None:
            abort(400, "say which step to mark done")
        sas.mark_done(run_id, step, by=by, reason=reason, result=json_field(form, "result"))
    elif action == "cancel":
        return done_message(action, run_id, state=sas.cancel(run_id, by=by, reason=reason))
    elif action == "rerun":
        if step is None:
            abort(400, "say which step to rerun from")
        return done_message(action, run_id, new_run=sas.rerun(run_id, step, by=by, reason=reason).id)
    else:
        getattr(sas, action)(run_id, by=by, reason=reason)
    return done_message(action, run_id, step=step)


def bulk_action(args: MultiDict[str, str]) -> str:
    action = args.get("action", "")
    if action not in BULK:
        abort(400, f"a bulk action is one of {', '.join(BULK)}, got {action!r}")
    return action


def json_field(form: MultiDict[str, str], name: str) -> Any:
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        abort(400, f"{name} is not valid JSON: {exc}")


def dashboard_actor() -> Actor:
    """Who acts from the dashboard (:mod:`sas_app.web.people`), from the request's address."""
    return Actor(g.person.name, g.person.role, "dashboard", request.remote_addr or "")


def operator_only() -> None:
    """403 (a page saying why) unless the person is an operator or above."""
    if not g.person.may(Role.OPERATOR):
        abort(Response(render_template("refused.html", message=f"{g.person.name} is {g.person.role}: acting on runs "
                                       "needs the operator role or above", back="/runs"), 403))
