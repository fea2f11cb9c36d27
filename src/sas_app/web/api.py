"""The HTTP API (``/api/v1``, JSON): submit runs, read and list them, wait for one to end, signal
them, act on them, read the alerts — for services in any language and for a curl in a runbook.
Served with the dashboard (``sas dashboard``), its OpenAPI document at ``/api/v1/openapi.json``,
generated from :mod:`sas_app.web.api_models`.

Every request carries an API token (``Authorization: Bearer sas_…``, from ``sas token create``);
its role says what it may do (:mod:`sas_app.interfaces.access`). Every action is appended to the
audit trail, done or refused. Errors are problem details (``application/problem+json``) whose
``detail`` has the CLI's words; nothing is written when a request is refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flask import Response, g, request
from flask_openapi3.blueprint import APIBlueprint
from flask_openapi3.models.info import Info
from flask_openapi3.models.tag import Tag
from flask_openapi3.openapi import OpenAPI
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from sas_app.errors import (
    DuplicateBusinessKey,
    InvalidOperation,
    InvalidSignal,
    InvalidSubmission,
    NotAllowed,
    SasError,
    SchemaNotReady,
    TransientError,
    UnknownRun,
    UnknownWorkflow,
)
from sas_app.interfaces.access import Actor, looks_like_token, require
from sas_app.interfaces.audit import Entry, new_batch
from sas_app.interfaces.operations import done_message
from sas_app.settings import Settings
from sas_app.states import RUN_STATES, TERMINAL_RUN_STATES, Role
from sas_app.store.observe import Observer
from sas_app.web import api_models as m

if TYPE_CHECKING:
    from sas_app.app import SasApp
    from sas_app.interfaces.client import RunView
    from sas_app.store import RunRow

log = logging.getLogger(__name__)


class MissingField(InvalidOperation):
    """An action asked without a field it needs (which step to mark done)."""

PREFIX = "/api/v1"
PROBLEM = "application/problem+json"
#: the status each refusal answers with
STATUS: tuple[tuple[type[SasError], int], ...] = (
    (UnknownRun, 404), (DuplicateBusinessKey, 409), (UnknownWorkflow, 422), (InvalidSubmission, 422),
    (InvalidSignal, 422), (MissingField, 422), (InvalidOperation, 409), (SchemaNotReady, 503),
    (TransientError, 503),
)
#: the actions on a run, by their path: the role each needs is operator
ACTIONS = ("cancel", "compensate", "pause", "resume", "resubmit", "mark-done", "rerun")
#: query parameters some clients put a token in: refused, whatever they hold
_TOKEN_ARGS = {"token", "access_token", "api_key", "apikey"}
_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
           500: "Internal Server Error", 503: "Service Unavailable"}


def max_body(settings: Settings) -> int:
    """The largest body a request may send: ten of the largest payloads the store takes (a batch of
    many small runs fits; a larger batch is sent in parts), and 64 KiB for the rest."""
    return settings.max_payload_bytes * 10 + 64 * 1024


def problem(status: int, detail: str, errors: list[dict[str, Any]] | None = None,
            headers: dict[str, str] | None = None) -> Response:
    body = m.Problem(title=_TITLES.get(status, "Error"), status=status, detail=detail, errors=errors)
    return Response(body.model_dump_json(exclude_none=True), status, headers, mimetype=PROBLEM)


def invalid(exc: ValidationError) -> Response:
    """A request whose fields the models refuse: 422, naming each field and why."""
    errors = [{"field": ".".join(str(p) for p in e["loc"]) or "(body)", "problem": e["msg"]} for e in exc.errors()]
    detail = "; ".join(f"{e['field']}: {e['problem']}" for e in errors)
    return problem(422, f"the request is not valid: {detail}", errors)


def create_api(sas: SasApp, *, waits: int = 2) -> OpenAPI:
    """The API's WSGI application for ``sas``; at most ``waits`` requests wait for a run at once
    (each holds a server thread; 0: none may)."""
    api = OpenAPI(__name__, info=Info(title="sas_app", version="1"), validation_error_status=422,
                  validation_error_callback=invalid, doc_ui=False,
                  security_schemes={"token": {"type": "http", "scheme": "bearer"}})
    api.config["MAX_CONTENT_LENGTH"] = max_body(sas.settings)
    waiting = threading.BoundedSemaphore(waits) if waits > 0 else None
    observer = Observer(sas.store)
    security: list[dict[str, list[str]]] = [{"token": []}]
    refusal = {"description": "refused: a problem in the CLI's words; nothing changed",
               "content": {PROBLEM: {"schema": m.Problem.model_json_schema()}}}
    bp = APIBlueprint("v1", __name__, url_prefix=PREFIX, abp_security=security,
                      abp_responses={"4XX": refusal, 422: refusal, "5XX": refusal})

    @api.before_request
    def authenticate() -> Response | None:
        if looks_like_token(request.path) or looks_like_token(request.query_string.decode("latin-1")) or \
                _TOKEN_ARGS & set(request.args):
            return problem(400, "a token goes in the Authorization header (Bearer), never in the URL: "
                                "URLs end up in logs and browser histories")
        if request.path == f"{PREFIX}/openapi.json":
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return problem(401, "send an API token: Authorization: Bearer sas_... (sas token create)",
                           headers={"WWW-Authenticate": 'Bearer realm="sas"'})
        row = sas.tokens.verify(token)
        g.actor = Actor(row.name, Role(row.role), "api", f"{request.remote_addr or ''} token {row.id}")
        if request.method == "POST":
            if not request.is_json:
                got = request.mimetype or "nothing"
                return problem(415, f"send JSON (Content-Type: application/json), got {got!r}")
            try:
                body = json.loads(request.get_data(cache=True) or b"null")
            except (ValueError, RecursionError) as exc:
                return problem(400, f"the body is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}")
            if not isinstance(body, dict):
                return problem(422, f"the body must be a JSON object, got {type(body).__name__}")
        return None

    @api.errorhandler(SasError)
    def refused(exc: SasError) -> Response:
        if isinstance(exc, NotAllowed):
            headers = {"WWW-Authenticate": 'Bearer realm="sas"'} if exc.status == 401 else None
            return problem(exc.status, str(exc), headers=headers)
        status = next((code for kind, code in STATUS if isinstance(exc, kind)), 409)
        return problem(status, str(exc))

    @api.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 413:
            return problem(413, f"the body is over {api.config['MAX_CONTENT_LENGTH']} bytes")
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return problem(status, exc.description or _TITLES.get(status, "error"), headers=headers)

    @api.errorhandler(Exception)
    def failed(exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.path)
        return problem(500, f"the request failed, nothing was changed by it unless its action says so: "
                            f"{type(exc).__name__}")

    def actor(needed: Role, what: str) -> Actor:
        who: Actor = g.actor
        require(who, needed, what)
        return who

    def run_of(row: RunRow) -> m.Run:
        return m.Run(**m.Run.fields(row, row.process_state in TERMINAL_RUN_STATES))

    def detail(view: RunView) -> m.RunDetail:
        children = [c.id for c in sas.store.children(view.id)]
        return m.RunDetail(**m.Run.fields(view.run, view.terminal, children),
                           steps=[m.Step.of(s) for s in view.steps], events=[m.Event.of(e) for e in view.events])

    def answer(model: Any, status: int = 200) -> Response:
        return Response(model.model_dump_json(), status, mimetype="application/json")

    runs_tag, act_tag, signal_tag = Tag(name="runs"), Tag(name="acting on runs"), Tag(name="signals")

    @bp.post("/runs", tags=[runs_tag], responses={200: m.Submitted, 201: m.Submitted})
    def submit(body: m.Submit) -> Response:
        """Submit a run: 201 with the new run, or 200 with the run the business key already names."""
        who: Actor = g.actor
        with sas.audit.acting(who, "submit", target=f"{body.workflow}:{body.business_key}") as entry:
            require(who, Role.OPERATOR, "submitting a run")
            handle = sas.submit(body.workflow, body.payload, business_key=body.business_key,
                                reply_to=body.reply_to, priority=body.priority)
            entry.run_id = handle.id
        row = sas.store.get_run(handle.id)  # the run alone: its steps and history are GET /runs/{id}'s
        if row is None:  # deleted in the instant since (a purge of a run that ended at once)
            raise UnknownRun(f"run {handle.id} was deleted as it was submitted")
        return answer(m.Submitted(created=handle.created, run=run_of(row)), 201 if handle.created else 200)

    @bp.post("/runs/batch", tags=[runs_tag], responses={200: m.BatchResult})
    def submit_batch(body: m.SubmitBatch) -> Response:
        """Submit many runs in one transaction: each item's run, or why it was refused (nothing of it written)."""
        who: Actor = g.actor
        batch = new_batch()
        with sas.audit.acting(who, "submit", target=f"a batch of {len(body.runs)}", batch=batch, only_refusal=True):
            require(who, Role.OPERATOR, "submitting runs")
        with sas.audit.acting(who, "submit", target=f"a batch of {len(body.runs)}", batch=batch, only_refusal=True):
            results = sas.submit_many([item.model_dump() for item in body.runs])
        outcomes, items = [], []
        for item, done in zip(body.runs, results, strict=True):
            run_id, error = (done.handle.id, None) if done.handle else (None, str(done.error))
            entry = Entry(who, "submit", run_id=run_id, target=f"{item.workflow}:{item.business_key}", batch=batch)
            outcomes.append((entry, "refused" if error else "done", error))
            items.append(m.BatchItem(index=done.index, created=done.handle.created if done.handle else None,
                                     run_id=run_id, error=error))
        sas.audit.record_many(outcomes)
        return answer(m.BatchResult(results=items))

    @bp.get("/runs", tags=[runs_tag], responses={200: m.RunPage})
    def list_runs(query: m.RunQuery) -> Response:
        """Runs, newest first, filtered; a page at a time (follow `next`)."""
        actor(Role.VIEWER, "reading runs")
        if query.state is not None and query.state not in RUN_STATES:
            raise InvalidSubmission(f"unknown state {query.state!r}; one of {', '.join(RUN_STATES)}")
        rows = sas.store.list_runs(state=query.state, workflow=query.workflow, key=query.key, version=query.version,
                                   failure=query.failure, since=epoch(query.since, "since"),
                                   until=epoch(query.until, "until"), after=cursor(query.cursor), limit=query.limit + 1)
        page = rows[:query.limit]
        last = page[-1] if len(rows) > query.limit else None
        next_cursor = None if last is None else base64.urlsafe_b64encode(
            json.dumps([last.created_at, last.id]).encode()).decode()
        return answer(m.RunPage(runs=[run_of(r) for r in page], next=next_cursor))

    @bp.get("/runs/<run_id>", tags=[runs_tag], responses={200: m.RunDetail})
    def get_run(path: m.RunPath) -> Response:
        """A run: its state, steps and their results, history, and links to its parent, children and rerun."""
        actor(Role.VIEWER, "reading runs")
        return answer(detail(sas.get_run(path.run_id)))

    @bp.get("/runs/<run_id>/wait", tags=[runs_tag], responses={200: m.RunDetail})
    def wait_run(path: m.RunPath, query: m.WaitQuery) -> Response:
        """The run once it has ended, or as it is after `timeout` seconds (see `terminal`)."""
        actor(Role.VIEWER, "reading runs")
        view = sas.get_run(path.run_id)
        if not view.terminal:
            if waiting is None or not waiting.acquire(blocking=False):
                return problem(503, "as many requests as this server allows are waiting for runs already; "
                                    "retry, or read the run (GET) instead", headers={"Retry-After": "1"})
            try:
                view = sas.handle(path.run_id).wait(query.timeout)
            except TimeoutError:
                view = sas.get_run(path.run_id)
            finally:
                waiting.release()
        return answer(detail(view))

    @bp.post("/runs/<run_id>/signals", tags=[signal_tag], responses={200: m.SignalReceipt})
    def signal(path: m.RunPath, body: m.Signal) -> Response:
        """Send an event to a run waiting for it (kept until it gets there)."""
        who: Actor = g.actor
        with sas.audit.acting(who, "signal", run_id=path.run_id, target=body.event):
            require(who, Role.APPROVER, "answering a wait")
            receipt = sas.signal(path.run_id, body.event, body.payload, by=who.name)
        return answer(m.SignalReceipt(run_id=receipt.run_id, event=receipt.event, status=receipt.status))

    @bp.post("/signals", tags=[signal_tag], responses={200: m.SignalReceipt})
    def signal_by_key(body: m.SignalByKey) -> Response:
        """Send an event to the run a workflow's business key names."""
        who: Actor = g.actor
        with sas.audit.acting(who, "signal", target=f"{body.workflow}:{body.business_key}:{body.event}") as entry:
            require(who, Role.APPROVER, "answering a wait")
            receipt = sas.signal(workflow=body.workflow, business_key=body.business_key, event=body.event,
                                 payload=body.payload, by=who.name)
            entry.run_id = receipt.run_id
        return answer(m.SignalReceipt(run_id=receipt.run_id, event=receipt.event, status=receipt.status))

    @bp.post("/signal-with-start", tags=[signal_tag], responses={200: m.SignalReceipt, 201: m.SignalReceipt})
    def signal_with_start(body: m.SignalWithStart) -> Response:
        """Start the run if no run has this business key (201), then send it the event."""
        who: Actor = g.actor
        with sas.audit.acting(who, "signal_with_start",
                              target=f"{body.workflow}:{body.business_key}:{body.event}") as entry:
            require(who, Role.OPERATOR, "starting a run")
            workflow = sas.workflows.get(body.workflow)
            if workflow is None:
                raise UnknownWorkflow(f"unknown workflow {body.workflow!r}; registered: {sorted(sas.workflows)}")
            events = sorted({s.event for s in workflow.specs if s.event is not None})
            if body.event not in events:
                raise InvalidSignal(f"workflow {body.workflow!r} waits for no event {body.event!r}; it waits for "
                                    f"{', '.join(events) or 'none'}")
            existing = sas.store.find_run(body.workflow, body.business_key)
            started = existing is None
            if existing is None:
                try:  # another request may start it first: then it is signalled as found
                    handle = sas.submit(body.workflow, body.payload, business_key=body.business_key,
                                        priority=body.priority)
                    started = handle.created
                except DuplicateBusinessKey:
                    existing = sas.store.find_run(body.workflow, body.business_key)
                    if existing is None:
                        raise
            run_id = existing.id if existing is not None else handle.id
            entry.run_id = run_id
            receipt = sas.signal(run_id, body.event, body.signal, by=who.name)
        return answer(m.SignalReceipt(run_id=receipt.run_id, event=receipt.event, status=receipt.status,
                                      started=started), 201 if started else 200)

    for name in ACTIONS:
        bp.post(f"/runs/<run_id>/{name}", tags=[act_tag], responses={200: m.Done},
                operation_id=f"run_{name.replace('-', '_')}")(acting_on_runs(sas, name, actor, run_of, answer))

    @bp.get("/alerts", tags=[Tag(name="alerts")], responses={200: m.Alerts})
    def alerts(query: m.AlertQuery) -> Response:
        """The newest alerts, with their run's workflow, key and state now."""
        actor(Role.VIEWER, "reading alerts")
        rows = observer.alerts(query.limit, current=query.current)
        return answer(m.Alerts(alerts=[
            m.Alert(id=a.id, at=a.at, run_id=a.run_id, kind=a.kind, reason=a.reason, position=a.position,
                    attempt=a.attempt, workflow=a.workflow, business_key=a.business_key, run_state=a.process_state)
            for a in rows]))

    access_tag = Tag(name="access")

    @bp.get("/tokens", tags=[access_tag], responses={200: m.Tokens})
    def tokens() -> Response:
        """Every API token, newest first (never the tokens themselves)."""
        actor(Role.ADMIN, "reading tokens")
        return answer(m.Tokens(tokens=[m.Token.of(r) for r in sas.store.tokens()]))

    @bp.post("/tokens", tags=[access_tag], responses={201: m.TokenMade})
    def make_token(body: m.NewToken) -> Response:
        """Make a token: the answer holds it, once; only its digest is kept."""
        who: Actor = g.actor
        with sas.audit.acting(who, "token_create", target=body.name):
            require(who, Role.ADMIN, "making a token")
            row, token = sas.tokens.create(body.name, body.role, by=who.name, lifetime=body.expires_days * 86400)
        return answer(m.TokenMade(token=token, about=m.Token.of(row)), 201)

    @bp.post("/tokens/<token_id>/revoke", tags=[access_tag], responses={200: m.Token})
    def revoke_token(path: m.TokenPath, body: m.Revoke) -> Response:
        """Revoke a token: refused from then on."""
        who: Actor = g.actor
        with sas.audit.acting(who, "token_revoke", target=path.token_id, reason=body.reason):
            require(who, Role.ADMIN, "revoking a token")
            row = sas.tokens.revoke(path.token_id, by=who.name)
        return answer(m.Token.of(row))

    api.register_api(bp)
    api.add_url_rule(f"{PREFIX}/openapi.json", "openapi", lambda: api.api_doc)  # read without a token
    return api


def acting_on_runs(sas: SasApp, name: str, actor: Callable[[Role, str], Actor], run_of: Callable[..., m.Run],
                   answer: Callable[..., Response]) -> Callable[..., Response]:
    """The view of ``POST /runs/{id}/<name>``: the operator's action, as the CLI takes it."""
    action = name.replace("-", "_")

    def view(path: m.RunPath, body: m.Act) -> Response:
        who: Actor = g.actor
        run_id, step, new_run = path.run_id, body.step, None
        with sas.audit.acting(who, action, run_id=run_id, target=step, reason=body.reason):
            require(who, Role.OPERATOR, f"{name} of a run")
            if action == "resubmit":
                sas.resubmit(run_id, by=who.name, reason=body.reason, step=step, step_input=body.input)
            elif action == "mark_done":
                if step is None:
                    raise MissingField("say which step to mark done (step)")
                sas.mark_done(run_id, step, by=who.name, reason=body.reason, result=body.result)
            elif action == "rerun":
                if step is None:
                    raise MissingField("say which step to rerun from (step)")
                new_run = sas.rerun(run_id, step, by=who.name, reason=body.reason).id
            else:
                getattr(sas, action)(run_id, by=who.name, reason=body.reason)
        view_now = sas.get_run(run_id)
        said = done_message(action, run_id, step=step, state=view_now.process_state, new_run=new_run)
        return answer(m.Done(message=said, run=run_of(view_now.run), new_run=new_run))

    view.__name__ = f"run_{action}"
    view.__doc__ = f"{name.capitalize()} a run, as `sas {name.replace('-', '_')}` does (role: operator)."
    return view


def cursor(text: str | None) -> tuple[float, str] | None:
    """The ``(created_at, id)`` a page's ``next`` stands for; :class:`InvalidSubmission` for one not made here."""
    if text is None:
        return None
    try:
        created_at, run_id = json.loads(base64.urlsafe_b64decode(text.encode()))
        return float(created_at), str(run_id)
    except (ValueError, TypeError, binascii.Error):
        raise InvalidSubmission(f"cursor {text!r} is not one a page of runs gave") from None


def epoch(moment: datetime | None, name: str) -> float | None:
    """``moment`` in epoch seconds; :class:`InvalidSubmission` for one no clock can hold."""
    if moment is None:
        return None
    try:
        return moment.timestamp()
    except (ValueError, OverflowError, OSError) as exc:
        raise InvalidSubmission(f"{name}: {moment.isoformat()} is not a time the store can compare: {exc}") from None
