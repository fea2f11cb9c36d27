"""Workflow definitions: steps, each with its agent action, complete-by budget, failure threshold
and optional compensating action, and what it waits for (``after=``: by default the step before,
so a list of steps is a straight line). A step with ``for_each=`` runs one branch per element of
a list. Mistakes — an unknown name, a cycle, a bad bound — are caught when a workflow is registered.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from graphlib import CycleError, TopologicalSorter
from typing import TYPE_CHECKING, Any, Protocol

from .errors import WorkflowDefinitionError
from .routing import step_key
from .store import NewStep

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from .store import RunRow

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,99}$")


class ActionRef(Protocol):
    """Anything that names an agent action: an ``"agent.action"`` string or an AgentAction."""

    @property
    def qualname(self) -> str: ...


def action_name(ref: str | ActionRef) -> str:
    return ref if isinstance(ref, str) else ref.qualname


@dataclass(frozen=True)
class Escalate:
    """What a step does at its failure threshold instead of failing at once — the pattern's
    Supervisor "waiting for an extended period before notifying the Scheduler that it should retry
    the step, in the expectation that the fault will be resolved": wait ``wait``, then make
    ``retries`` more attempts; if those fail too, ``then``: ``"compensate"`` (the run is undone) or
    ``"error"`` (the run is left in error for an operator). An alert on each rung."""

    wait: float | timedelta
    retries: int = 1
    then: str = "compensate"

    def as_stored(self) -> dict[str, Any]:
        return {"wait": float(_seconds(self.wait)), "retries": self.retries, "then": self.then}


@dataclass(frozen=True)
class Step:
    """One step of a workflow.

    ``action`` names the agent call that performs it (``"payment.charge"``); ``timeout`` is its
    complete-by budget in seconds for each attempt; after ``max_failures`` failed attempts the step
    fails for good, with one alert, and the run is undone (each step with a ``compensate`` whose
    effect may have happened, last first) — or goes to ``error`` when there is nothing to undo.
    ``compensate`` names the agent call that undoes it.

    ``after`` names the steps it waits for: left out, the step before it (the first step waits
    for nothing); ``after=[]`` starts it with the run. Steps whose ``after`` are all completed run
    at once, and a step waiting for several is their join.

    ``for_each`` runs the step once per element of a list — a key of the payload (``"items"``) or
    of an earlier step's result (``"reserve_stock.items"``) — each branch with its own attempts,
    complete-by and idempotency key (``<run>:<step>:<index>``), at most ``max_parallel`` at once.
    The step's result is the list of its branches' results, in order.

    ``child`` (instead of ``action``) starts another registered workflow as a child run, with this
    run's payload, and waits for it: the step completes with the child's results when it is
    processed and fails when it ends otherwise. Cancelling or undoing this run cancels a live
    child. The child is supervised like any run; its ``timeout`` does not apply.
    """

    name: str
    action: str | ActionRef | None = None
    timeout: float = 30.0
    max_failures: int = 3
    compensate: str | ActionRef | None = None
    after: Sequence[str] | None = None
    for_each: str | None = None
    max_parallel: int = 10
    child: str | None = None
    #: a durable sleep (see :func:`Sleep`): seconds, or where the time to wake is
    sleep: float | None = None
    sleep_until: str | None = None
    #: a wait for an event (see :func:`WaitFor`), and what its timeout does
    event: str | None = None
    on_timeout: str = "compensate"
    #: at the failure threshold: fail at once (None, the default), or escalate (see :class:`Escalate`)
    on_exhausted: Escalate | None = None

    @property
    def agent(self) -> str:
        return "" if self.action is None else action_name(self.action).split(".", 1)[0]

    @property
    def action_name(self) -> str:
        return "" if self.action is None else action_name(self.action).split(".", 1)[1]


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value


def Sleep(name: str, seconds: float | timedelta | None = None, *, until: str | None = None,
          after: Sequence[str] | None = None) -> Step:
    """A step that waits: ``seconds``, or until the time found at ``until`` (a payload key, or an
    earlier step's result key ``"step.key"``; epoch seconds or an ISO 8601 time). The run waits in
    the store, holding no message and no worker slot, and the Supervisor's sweep wakes it on the
    database's clock. Its result is ``{"slept_until": <epoch seconds>}``."""
    if (seconds is None) == (until is None):
        raise WorkflowDefinitionError(f"sleep {name!r} needs seconds or until=, exactly one")
    return Step(name, sleep=_seconds(seconds), sleep_until=until, after=after)


#: what a wait's timeout does: undo the run, leave it in error for an operator, or go on without the event
ON_TIMEOUT = ("compensate", "error", "continue")


def WaitFor(name: str, event: str, *, timeout: float | timedelta, on_timeout: str = "compensate",
            after: Sequence[str] | None = None) -> Step:
    """A step that waits for ``event``: ``sas.signal(run, event, payload)`` ends it, and the
    signal's payload is its result. A signal sent before the run gets here is kept and consumed
    when it does. After ``timeout`` seconds with none, ``on_timeout``: ``"compensate"`` (the run is
    undone), ``"error"`` (the run is left in error for an operator) or ``"continue"`` (the result
    is ``{"timed_out": true}``). Like a sleep, it waits in the store, holding no message and no
    worker slot."""
    return Step(name, timeout=_seconds(timeout), event=event, on_timeout=on_timeout, after=after)


OnSubmit = Callable[["Connection", "RunRow"], None]


@dataclass(frozen=True)
class Workflow:
    """A named, ordered list of steps.

    ``on_submit(connection, run)`` runs inside the submit transaction: write your own rows (the
    order, in the example) there and they commit, or roll back, together with the run.
    """

    name: str
    steps: Sequence[Step]
    on_submit: OnSubmit | None = None
    description: str = ""
    #: recorded on each run; left out, a hash of the step graph (see :func:`definition_version`)
    version: str | None = None
    #: how long a run may take in all (seconds or a timedelta): past it the Supervisor undoes it
    deadline: float | timedelta | None = None
    #: one run at a time per key: the payload key whose value groups runs, and how many of a
    #: group may be live at once (the others wait, pending, in submission order)
    concurrency_key: str | None = None
    max_running: int = 1

    def slot_of(self, payload: Any) -> str | None:
        """The value of this workflow's concurrency key in ``payload`` (None without a key);
        ``ValueError`` naming the problem when it is missing or not a string or integer."""
        if self.concurrency_key is None:
            return None
        value = payload.get(self.concurrency_key) if isinstance(payload, dict) else None
        if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
            raise ValueError(f"workflow {self.name!r} runs one at a time per {self.concurrency_key!r}: the payload "
                             f"needs that key, a string or an integer, got {value!r}")
        slot = str(value)
        if len(slot) > 300:
            raise ValueError(f"the payload's {self.concurrency_key!r} is longer than 300 characters")
        return slot

    @property
    def deadline_seconds(self) -> float | None:
        return _seconds(self.deadline)  # type: ignore[no-any-return]

    @cached_property
    def waits_for(self) -> list[list[int]]:
        """For each step (by position), the positions of the steps it waits for."""
        where = {s.name: i for i, s in enumerate(self.steps)}
        return [
            ([i - 1] if i else []) if s.after is None else [where[name] for name in s.after]
            for i, s in enumerate(self.steps)
        ]

    @cached_property
    def is_linear(self) -> bool:
        """Each step waits for the one before it, none fans out and none is a child run: the
        Scheduler's hot path."""
        return all(s.for_each is None and s.child is None and s.action is not None
                   for s in self.steps) and self.waits_for == [
            [i - 1] if i else [] for i in range(len(self.steps))
        ]


    def new_steps(self, run_id: str) -> list[NewStep]:
        """The step rows a run of this workflow starts with: a copy of the graph."""
        return [
            NewStep(s.name, s.agent, s.action_name, float(s.timeout), s.max_failures, step_key(run_id, s.name),
                    undo=None if s.compensate is None else action_name(s.compensate), waits_for=waits,
                    for_each=s.for_each, max_parallel=s.max_parallel if s.for_each else None, child=s.child,
                    sleep=None if s.sleep is None else float(s.sleep), sleep_until=s.sleep_until,
                    event=s.event, on_timeout=s.on_timeout if s.event is not None else None,
                    escalate=None if s.on_exhausted is None else s.on_exhausted.as_stored())
            for s, waits in zip(self.steps, self.waits_for, strict=True)
        ]

    @cached_property
    def run_version(self) -> str:
        """The version each run records: ``version``, or else the first 12 hex digits of a hash of
        the step graph (names, actions, undo, budgets, what each step waits for, fan-out)."""
        if self.version is not None:
            return self.version
        graph = [
            [s.name, None if s.action is None else action_name(s.action),
             None if s.compensate is None else action_name(s.compensate),
             float(s.timeout), s.max_failures, waits, s.for_each, s.max_parallel if s.for_each else None, s.child,
             s.sleep, s.sleep_until, *([s.event, s.on_timeout] if s.event is not None else []),
             *([s.on_exhausted.as_stored()] if s.on_exhausted is not None else [])]
            for s, waits in zip(self.steps, self.waits_for, strict=True)
        ]
        return hashlib.sha256(json.dumps(graph, separators=(",", ":")).encode()).hexdigest()[:12]



def check_workflow(
    workflow: Workflow, known_actions: Iterable[str], *, visibility_timeout: float,
    known_workflows: Iterable[str] = (), max_sleep: float = 30 * 86400, max_deadline: float = 90 * 86400,
) -> None:
    """Raise :class:`WorkflowDefinitionError` naming the first mistake in ``workflow``
    (``known_workflows``: those registered before it, which its child steps may start)."""
    known = set(known_actions)
    where = f"workflow {workflow.name!r}"
    if not isinstance(workflow.name, str) or not _NAME.match(workflow.name):
        raise WorkflowDefinitionError(
            f"workflow name {workflow.name!r} must start with a letter and use only letters, "
            "digits, '_' and '-' (at most 100)"
        )
    if not workflow.steps:
        raise WorkflowDefinitionError(f"{where} has no steps")
    seen: set[str] = set()
    for s in workflow.steps:
        if not isinstance(s, Step):
            raise WorkflowDefinitionError(f"{where}: {s!r} is not a Step")
        if not isinstance(s.name, str) or not _NAME.match(s.name):
            raise WorkflowDefinitionError(f"{where}: step name {s.name!r} is not a valid name")
        if s.name in seen:
            raise WorkflowDefinitionError(f"{where}: duplicate step name {s.name!r}")
        seen.add(s.name)
        if s.sleep is not None or s.sleep_until is not None:
            _check_sleep(where, s, max_sleep)
            continue
        if s.event is not None:
            _check_wait(where, s, max_sleep)
            continue
        _check_child(where, s, set(known_workflows))
        for label, ref in (("action", s.action), ("compensate", s.compensate)):
            if ref is None:
                continue
            name = action_name(ref)
            if name not in known:
                raise WorkflowDefinitionError(
                    f"{where}, step {s.name!r}: unknown agent action {name!r} for {label}; "
                    f"registered: {sorted(known) or 'none'}"
                )
        if not _is_number(s.timeout) or s.timeout <= 0:
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: timeout must be a positive number of seconds, got {s.timeout!r}"
            )
        if s.timeout >= visibility_timeout:
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: timeout {s.timeout}s is not below the broker's "
                f"visibility timeout ({visibility_timeout}s); raise SAS_VISIBILITY_TIMEOUT or the "
                "message would be delivered twice while the agent still works on it"
            )
        if not isinstance(s.max_failures, int) or isinstance(s.max_failures, bool) or s.max_failures < 1:
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: max_failures must be an integer >= 1, got {s.max_failures!r}"
            )
        _check_fan_out(where, s)
        _check_escalation(where, s, max_sleep)
    _check_graph(where, workflow)
    deadline = workflow.deadline_seconds
    if deadline is not None and (not _is_number(deadline) or not 0 < deadline <= max_deadline):
        raise WorkflowDefinitionError(f"{where}: deadline must be more than 0 and at most {max_deadline:g} seconds "
                                      f"(SAS_MAX_DEADLINE), got {workflow.deadline!r}")
    _check_concurrency(where, workflow)
    events = [s.event for s in workflow.steps if s.event is not None]
    twice = sorted({e for e in events if events.count(e) > 1})
    if twice:
        raise WorkflowDefinitionError(f"{where}: more than one step waits for event {twice[0]!r}; give each wait "
                                      "its own event, so a signal names one wait")
    if workflow.version is not None and (not isinstance(workflow.version, str) or not _NAME.match(workflow.version)):
        raise WorkflowDefinitionError(f"{where}: version {workflow.version!r} must be a name (letters, digits, "
                                      "'_', '-')")


def _check_sleep(where: str, s: Step, max_sleep: float) -> None:
    if (s.action is not None or s.child is not None or s.for_each is not None or s.compensate is not None
            or s.event is not None or s.on_exhausted is not None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a sleep runs no action, child, fan-out, undo "
                                      "or escalation")
    if (s.sleep is None) == (s.sleep_until is None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a sleep needs seconds or until=, exactly one")
    if s.sleep is not None and (not _is_number(s.sleep) or not 0 < s.sleep <= max_sleep):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: sleep must be more than 0 and at most "
                                      f"{max_sleep:g} seconds (SAS_MAX_SLEEP), got {s.sleep!r}")
    if s.sleep_until is not None and (not isinstance(s.sleep_until, str)
                                      or not all(_NAME.match(part) for part in s.sleep_until.split(".", 1))):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: until must name a payload key ('wake_at') or "
                                      f"an earlier step's result key ('quote.valid_until'), got {s.sleep_until!r}")


def _check_wait(where: str, s: Step, max_wait: float) -> None:
    if (s.action is not None or s.child is not None or s.for_each is not None or s.compensate is not None
            or s.on_exhausted is not None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a wait runs no action, child, fan-out, undo or "
                                      "escalation (its on_timeout says what its timeout does)")
    if not isinstance(s.event, str) or not _NAME.match(s.event):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: event {s.event!r} must be a name (letters, "
                                      "digits, '_', '-')")
    if not _is_number(s.timeout) or not 0 < s.timeout <= max_wait:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a wait's timeout must be more than 0 and at most "
                                      f"{max_wait:g} seconds (SAS_MAX_SLEEP), got {s.timeout!r}")
    if s.on_timeout not in ON_TIMEOUT:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: on_timeout must be one of {', '.join(ON_TIMEOUT)}; "
                                      f"got {s.on_timeout!r}")


def _check_concurrency(where: str, workflow: Workflow) -> None:
    key, most = workflow.concurrency_key, workflow.max_running
    if key is not None and (not isinstance(key, str) or not _NAME.match(key)):
        raise WorkflowDefinitionError(f"{where}: concurrency_key must name a payload key, got {key!r}")
    if not isinstance(most, int) or isinstance(most, bool) or most < 1:
        raise WorkflowDefinitionError(f"{where}: max_running must be an integer >= 1, got {most!r}")


def _check_escalation(where: str, s: Step, max_wait: float) -> None:
    e = s.on_exhausted
    if e is None:
        return
    if not isinstance(e, Escalate):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: on_exhausted must be an Escalate(...), got {e!r}")
    if s.child is not None:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a child run is supervised on its own; it has no "
                                      "failure threshold to escalate")
    wait = _seconds(e.wait)
    if not _is_number(wait) or not 0 < wait <= max_wait:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Escalate wait must be more than 0 and at most "
                                      f"{max_wait:g} seconds (SAS_MAX_SLEEP), got {e.wait!r}")
    if not isinstance(e.retries, int) or isinstance(e.retries, bool) or not 1 <= e.retries <= s.max_failures:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Escalate retries must be an integer from 1 to "
                                      f"the step's max_failures ({s.max_failures}), got {e.retries!r}")
    if e.then not in ("compensate", "error"):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Escalate then must be 'compensate' or 'error', "
                                      f"got {e.then!r}")


def _check_child(where: str, s: Step, workflows: set[str]) -> None:
    """A step runs an agent action or a child workflow, registered before this one (so a
    workflow never starts itself)."""
    if (s.action is None) == (s.child is None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: give an agent action or child=<workflow>, "
                                      "exactly one of them")
    if s.child is None:
        return
    if s.child not in workflows:
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: child workflow {s.child!r} is not registered; register it before "
            f"this one (registered: {sorted(workflows) or 'none'})"
        )
    if s.for_each is not None:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a child run cannot fan out (for_each) yet")


def _check_fan_out(where: str, s: Step) -> None:
    if s.for_each is None:
        return
    if not isinstance(s.for_each, str) or not all(_NAME.match(part) for part in s.for_each.split(".", 1)):
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: for_each must name a payload key ('items') or an earlier step's "
            f"result key ('reserve_stock.items'), got {s.for_each!r}"
        )
    if not isinstance(s.max_parallel, int) or isinstance(s.max_parallel, bool) or s.max_parallel < 1:
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: max_parallel must be an integer >= 1, got {s.max_parallel!r}"
        )


def _check_graph(where: str, workflow: Workflow) -> None:
    """Every ``after`` names a step of this workflow, once, and the steps form no cycle; a
    ``for_each`` over an earlier result names a step it (indirectly) waits for."""
    names = [s.name for s in workflow.steps]
    for s in workflow.steps:
        if s.after is None:
            continue
        if isinstance(s.after, str) or not all(isinstance(n, str) for n in s.after):
            raise WorkflowDefinitionError(f"{where}, step {s.name!r}: after must be a list of step names, "
                                          f"got {s.after!r}")
        for name in s.after:
            if name not in names:
                raise WorkflowDefinitionError(f"{where}, step {s.name!r}: after names {name!r}, which is not a "
                                              f"step of this workflow; its steps: {names}")
            if name == s.name:
                raise WorkflowDefinitionError(f"{where}, step {s.name!r} waits for itself")
        if len(set(s.after)) != len(s.after):
            raise WorkflowDefinitionError(f"{where}, step {s.name!r}: after names a step twice: {list(s.after)}")
    waits = workflow.waits_for
    graph = {names[i]: {names[j] for j in deps} for i, deps in enumerate(waits)}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise WorkflowDefinitionError(f"{where}: the steps wait for each other in a cycle: {cycle}") from None
    for s in workflow.steps:
        source = (s.for_each or s.sleep_until or "").split(".", 1)
        if len(source) == 2 and source[0] not in _upstream(graph, s.name):
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: {'.'.join(source)!r} reads the result of {source[0]!r}, "
                f"which it does not wait for (add it to after=)" if source[0] in names else
                f"{where}, step {s.name!r}: {'.'.join(source)!r} names no step of this workflow; its steps: {names}"
            )


def _upstream(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every step ``name`` waits for, directly or not."""
    seen: set[str] = set()
    todo = list(graph[name])
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(graph[current])
    return seen


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
