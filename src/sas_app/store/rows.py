"""Rows as the store hands them out: frozen dataclasses, one per table, made from result rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from sqlalchemy import Table, column
from sqlalchemy.engine import Row
from sqlalchemy.sql.elements import ColumnClause

T = TypeVar("T")


@dataclass(frozen=True)
class RunRow:
    """A run as the store holds it (``RunView.run``): its workflow and business key, payload,
    ``process_state`` (a :class:`RunState` value), who holds it (``locked_by``) and when it is
    looked at next (``complete_by``), its deadline, parent and error; times are epoch seconds on
    the database's clock."""

    id: str
    workflow: str
    business_key: str
    payload: Any
    process_state: str
    locked_by: str | None
    complete_by: float | None
    failure_count: int
    reply_to: str | None
    error: str | None
    cancelled_by: str | None
    paused_by: str | None
    priority: int
    version: str | None
    linear: bool
    parent_run_id: str | None
    parent_position: int | None
    depth: int
    slot: str | None
    max_running: int | None
    slot_since: float | None
    schedule: str | None
    deadline: float | None
    created_at: float
    updated_at: float
    #: a rerun: the run it reruns and the step it reran from; on that run, its rerun
    rerun_of: str | None
    rerun_from: str | None
    rerun_as: str | None


@dataclass(frozen=True)
class StepRow:
    id: int
    run_id: str
    position: int
    name: str
    agent: str
    action: str
    state: str
    attempt: int
    locked_by: str | None
    complete_by: float | None
    not_before: float | None
    timeout: float
    max_failures: int
    failure_count: int
    idempotency_key: str
    undo: str | None
    compensates: int | None
    waits_for: list[int] | None
    for_each: str | None
    max_parallel: int | None
    branch_of: int | None
    branch: int | None
    item: Any
    child: str | None
    sleep: float | None
    sleep_until: str | None
    event: str | None
    on_timeout: str | None
    escalate: Any
    escalated: int
    input: Any
    result: Any
    error: str | None
    created_at: float
    updated_at: float
    completed_at: float | None
    condition: str | None
    poll: Any
    polls: int
    poll_until: float | None

    @property
    def is_undo(self) -> bool:
        return self.compensates is not None

    @property
    def is_sleep(self) -> bool:
        return self.sleep is not None or self.sleep_until is not None

    @property
    def is_wait(self) -> bool:
        return self.event is not None

    @property
    def in_store(self) -> bool:
        """A sleep or a wait for an event: the step waits in the store and no agent runs it."""
        return self.is_sleep or self.is_wait

    @property
    def is_branch(self) -> bool:
        return self.branch_of is not None

    @property
    def deps(self) -> list[int]:
        """The positions of the workflow steps this one waits for (a branch waits for none: its
        step starts it)."""
        if self.waits_for is not None:
            return list(self.waits_for)
        if self.is_undo or self.is_branch or self.position == 0:
            return []
        return [self.position - 1]


@dataclass(frozen=True)
class EventRow:
    id: int
    run_id: str
    position: int | None
    kind: str
    from_state: str | None
    to_state: str | None
    attempt: int | None
    actor: str | None
    at: float
    detail: Any


@dataclass(frozen=True)
class NewStep:
    """A step as written at submit time, copied from its workflow definition."""

    name: str
    agent: str
    action: str
    timeout: float
    max_failures: int
    idempotency_key: str
    undo: str | None = None
    waits_for: list[int] | None = None
    for_each: str | None = None
    max_parallel: int | None = None
    child: str | None = None
    sleep: float | None = None
    sleep_until: str | None = None
    event: str | None = None
    on_timeout: str | None = None
    escalate: dict[str, Any] | None = None
    #: its condition, as ``when quote.express`` or ``unless is_small()``
    condition: str | None = None
    #: a polling step's {"every", "max_wait"} (seconds)
    poll: dict[str, float] | None = None


@dataclass(frozen=True)
class SignalRow:
    id: int
    run_id: str
    event: str
    payload: Any
    status: str
    position: int | None
    sent_by: str | None
    received_at: float


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(kind: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))
    return names


@dataclass(frozen=True)
class TokenRow:
    """An API token as the store holds it: never its secret, only the secret's SHA-256."""

    id: str
    name: str
    role: str
    secret_sha256: str
    created_by: str
    created_at: float
    expires_at: float
    revoked_by: str | None
    revoked_at: float | None


@dataclass(frozen=True)
class AuditRow:
    """One action in the audit trail: who (``actor``, ``role``, ``via``, ``origin``), what
    (``action`` on ``run_id`` and ``target``, with ``reason``), when, and whether it was ``done``
    or ``refused`` (``refusal`` says why)."""

    id: int
    at: float
    actor: str
    role: str
    via: str
    origin: str
    action: str
    run_id: str | None
    target: str | None
    reason: str
    outcome: str
    refusal: str | None
    batch: str | None


def as_row(kind: type[T], row: Row[Any] | Mapping[str, Any]) -> T:
    """The dataclass ``kind`` made from a result row (or a row as a dict) holding (at least) its fields."""
    mapping = row._mapping if isinstance(row, Row) else row
    return kind(**{name: mapping[name] for name in field_names(kind)})


def prefixed_columns(table: Table, prefix: str, names: tuple[str, ...]) -> list[ColumnClause[Any]]:
    """The typed result columns ``<prefix><name>`` of a textual statement selecting ``table``'s
    columns ``names``: the types its rows are read with, through SQLAlchemy (which keeps the
    statement's result layout from one run to the next) or on the cursor (:func:`~sas_app.store.prepared.rows`)."""
    return [column(prefix + name, table.c[name].type) for name in names]


def prefixed(kind: type[T], mapping: Any, prefix: str) -> T:
    """The dataclass ``kind`` from columns named ``<prefix><field>`` (one statement returning two rows)."""
    return kind(**{name: mapping[prefix + name] for name in field_names(kind)})
