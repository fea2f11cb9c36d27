"""The HTTP API's requests and answers as pydantic models: they validate what comes in (a wrong
type or an unknown field is refused, naming it) and the OpenAPI document is generated from them."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from sas_app.store import EventRow, RunRow, StepRow
from sas_app.store.rows import TokenRow

#: the most runs one page of ``GET /runs`` may hold, and one ``POST /runs/batch`` may submit
MAX_PAGE = 500
MAX_BATCH = 500
#: the longest ``GET /runs/{id}/wait`` holds a request (seconds)
MAX_WAIT = 60.0


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_SCHEMAS: dict[type[BaseModel], dict[str, Any]] = {}


class Query(Strict):
    """A query string's model. flask-openapi3 asks for its JSON Schema on every request (to read
    each field's type); it is made once here, and a copy handed out."""

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if args or kwargs:
            return super().model_json_schema(*args, **kwargs)
        if cls not in _SCHEMAS:
            _SCHEMAS[cls] = super().model_json_schema()
        return copy.deepcopy(_SCHEMAS[cls])


# -- requests ---------------------------------------------------------------------------------------

class RunPath(Strict):
    run_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the run's id (32 hexadecimal digits)")


class Submit(Strict):
    workflow: str = Field(max_length=100)
    business_key: str = Field(description="the run's key in your domain: submitting it again returns that run")
    payload: Any = Field(default=None, description="the workflow's input, a JSON object")
    reply_to: str | None = Field(default=None, description="a queue told of the run's progress")
    priority: int = Field(default=5, ge=0, le=9)


class SubmitBatch(Strict):
    runs: list[Submit] = Field(min_length=1, max_length=MAX_BATCH)


class RunQuery(Query):
    state: str | None = None
    workflow: str | None = None
    version: str | None = None
    key: str | None = Field(default=None, description="a business-key prefix")
    failure: str | None = Field(default=None, description="words in the run's error")
    since: AwareDatetime | None = Field(default=None, description="created at or after (ISO 8601 with its "
                                                                  "zone, or epoch seconds)")
    until: AwareDatetime | None = Field(default=None, description="created before")
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    cursor: str | None = Field(default=None, max_length=200, description="the `next` of the page before")


class WaitQuery(Query):
    timeout: float = Field(default=30.0, gt=0, le=MAX_WAIT, description="seconds to wait for the run to end")


class AlertQuery(Query):
    current: bool | None = Field(default=None, description="true: runs that still need someone; false: the others")
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)


class Signal(Strict):
    event: str = Field(max_length=100)
    payload: Any = Field(default=None, description="the wait's result, a JSON object")


class SignalByKey(Signal):
    workflow: str = Field(max_length=100)
    business_key: str


class SignalWithStart(Strict):
    workflow: str = Field(max_length=100)
    business_key: str
    payload: Any = Field(default=None, description="the run's input, if it has to be started")
    event: str = Field(max_length=100)
    signal: Any = Field(default=None, description="the signal's payload")
    priority: int = Field(default=5, ge=0, le=9)


class Act(Strict):
    reason: str = Field(default="", max_length=2000)
    step: str | None = Field(default=None, max_length=200, description="resubmit, mark-done: which step; "
                                                                        "rerun: the step to rerun from")
    result: Any = Field(default=None, description="mark-done: the step's result")
    input: Any = Field(default=None, description="resubmit: the failed step's edited input")


class TokenPath(Strict):
    token_id: str = Field(pattern=r"^[0-9a-f]{12}$", description="the token's id (sas token list)")


class NewToken(Strict):
    name: str = Field(max_length=100, description="who uses it: shown in the audit trail")
    role: Literal["viewer", "approver", "operator", "admin"]
    expires_days: float = Field(default=90, gt=0, le=730)


class Revoke(Strict):
    reason: str = Field(default="", max_length=2000)


# -- answers ----------------------------------------------------------------------------------------

class Step(BaseModel):
    position: int
    name: str
    agent: str
    action: str
    state: str
    attempt: int
    failure_count: int
    result: Any = None
    error: str | None = None
    complete_by: float | None = None
    not_before: float | None = None
    child: str | None = None
    event: str | None = None

    @classmethod
    def of(cls, s: StepRow) -> Step:
        return cls(position=s.position, name=s.name, agent=s.agent, action=s.action, state=s.state,
                   attempt=s.attempt, failure_count=s.failure_count, result=s.result, error=s.error,
                   complete_by=s.complete_by, not_before=s.not_before, child=s.child, event=s.event)


class Event(BaseModel):
    id: int
    at: float
    kind: str
    position: int | None = None
    from_state: str | None = None
    to_state: str | None = None
    attempt: int | None = None
    actor: str | None = None
    detail: Any = None

    @classmethod
    def of(cls, e: EventRow) -> Event:
        return cls(id=e.id, at=e.at, kind=e.kind, position=e.position, from_state=e.from_state,
                   to_state=e.to_state, attempt=e.attempt, actor=e.actor, detail=e.detail)


class Links(BaseModel):
    self: str
    parent: str | None = None
    rerun_of: str | None = None
    rerun_as: str | None = None
    children: list[str] = []


class Run(BaseModel):
    id: str
    workflow: str
    business_key: str
    state: str
    terminal: bool
    version: str | None
    priority: int
    payload: Any = None
    error: str | None = None
    paused_by: str | None = None
    cancelled_by: str | None = None
    deadline: float | None = None
    created_at: float
    updated_at: float
    links: Links

    @staticmethod
    def fields(run: RunRow, terminal: bool, children: list[str] | None = None) -> dict[str, Any]:
        link = "/api/v1/runs/"
        return dict(
            id=run.id, workflow=run.workflow, business_key=run.business_key, state=run.process_state,
            terminal=terminal, version=run.version, priority=run.priority, payload=run.payload, error=run.error,
            paused_by=run.paused_by, cancelled_by=run.cancelled_by, deadline=run.deadline,
            created_at=run.created_at, updated_at=run.updated_at,
            links=Links(self=link + run.id, parent=run.parent_run_id and link + run.parent_run_id,
                        rerun_of=run.rerun_of and link + run.rerun_of, rerun_as=run.rerun_as and link + run.rerun_as,
                        children=[link + c for c in children or []]))


class RunDetail(Run):
    steps: list[Step]
    events: list[Event]


class RunPage(BaseModel):
    runs: list[Run]
    next: str | None = Field(description="the cursor of the next page; null on the last")


class Submitted(BaseModel):
    created: bool = Field(description="false: the business key already named this run")
    run: Run


class BatchItem(BaseModel):
    index: int
    created: bool | None = None
    run_id: str | None = None
    error: str | None = None


class BatchResult(BaseModel):
    results: list[BatchItem]


class SignalReceipt(BaseModel):
    run_id: str
    event: str
    status: str = Field(description="consumed (it ended the wait), kept (the run has not reached it yet) or "
                                    "ignored (that wait had its signal already)")
    started: bool | None = Field(default=None, description="signal-with-start: whether the run was started by it")


class Done(BaseModel):
    message: str = Field(description="what the CLI would say")
    run: Run
    new_run: str | None = Field(default=None, description="rerun: the new run's id")


class Alert(BaseModel):
    id: int
    at: float
    run_id: str
    kind: str
    reason: str
    position: int | None = None
    attempt: int | None = None
    workflow: str | None = None
    business_key: str | None = None
    run_state: str | None = None


class Alerts(BaseModel):
    alerts: list[Alert]


class Problem(BaseModel):
    """An error, as RFC 9457's problem details: ``detail`` in the CLI's words."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = Field(default=None, description="each field refused and why")


class Token(BaseModel):
    id: str
    name: str
    role: str
    created_by: str
    created_at: float
    expires_at: float
    revoked_by: str | None = None
    revoked_at: float | None = None

    @classmethod
    def of(cls, row: TokenRow) -> Token:
        return cls(id=row.id, name=row.name, role=row.role, created_by=row.created_by, created_at=row.created_at,
                   expires_at=row.expires_at, revoked_by=row.revoked_by, revoked_at=row.revoked_at)


class Tokens(BaseModel):
    tokens: list[Token]


class TokenMade(BaseModel):
    token: str = Field(description="the token itself: shown this once, kept only as a digest")
    about: Token
