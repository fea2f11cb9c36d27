"""Workflow definitions: steps, each with its agent action, complete-by budget, failure threshold
and optional compensating action, and what it waits for (``after=``: by default the step before,
so a list of steps is a straight line). A step with ``for_each=`` runs one branch per element of
a list; a ``Sleep`` or a ``WaitFor`` waits in the store; a ``Workflow`` may have a deadline, a
concurrency key and a version. Mistakes — an unknown name, a cycle, a bad bound — are caught when a
workflow is registered (:mod:`sas_app.definitions.checks`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sas_app.definitions.inputs import parsed_input, stored_input
from sas_app.definitions.steps import OnTimeout, StepDef, StepSpec, action_name, seconds_of, spec_of
from sas_app.messaging.routing import step_key
from sas_app.store import NewRun, NewStep

if TYPE_CHECKING:
    from pydantic import BaseModel
    from sqlalchemy import Connection

    from sas_app.store import RunRow

#: a name sas_app accepts for a workflow, step, event or schedule
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,99}$")


def is_name(value: Any) -> bool:
    """A name sas_app accepts for a workflow, step, event or schedule: a letter, then letters,
    digits, '_' or '-' (at most 100)."""
    return isinstance(value, str) and bool(NAME.match(value))


#: what a wait's timeout does: undo the run, leave it in error for an operator, or go on without the event
ON_TIMEOUT = tuple(o.value for o in OnTimeout)


def workflow_name(workflow: Workflow | str) -> str:
    """A workflow as its name (a caller may name one either way)."""
    return workflow.name if isinstance(workflow, Workflow) else workflow


OnSubmit = Callable[["Connection", "RunRow"], None]


@dataclass(frozen=True)
class Workflow:
    """A named, ordered list of steps.

    ``on_submit(connection, run)`` runs inside the submit transaction: write your own rows (the
    order, in the example) there and they commit, or roll back, together with the run.
    """

    name: str
    #: its steps (:class:`~sas_app.definitions.steps.Step`,
    #: :class:`~sas_app.definitions.steps.ChildRun`, ...), held as the engine reads them
    #: (:class:`~sas_app.definitions.steps.StepSpec`)
    steps: Sequence[StepDef | StepSpec]
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
    #: a pydantic model every payload is validated against (see :mod:`sas_app.definitions.inputs`):
    #: the action gets the parsed model as ``call.payload``
    input: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(spec_of(s) for s in self.steps))

    @property
    def specs(self) -> Sequence[StepSpec]:
        """The steps as the engine reads them."""
        return self.steps  # type: ignore[return-value]  # made so by __post_init__

    def stored_input(self, payload: Any) -> Any:
        """``payload`` as the store keeps it: validated against :attr:`input` and dumped as JSON
        (as it is, without a model); ``ValueError`` naming the workflow and every bad field."""
        if self.input is None:
            return payload
        try:
            return stored_input(self.input, payload)
        except ValueError as exc:
            raise ValueError(f"workflow {self.name!r}: {exc}") from None

    def parsed_input(self, payload: Any) -> Any:
        """A stored payload as the action gets it: the :attr:`input` model (as it is without one)."""
        return payload if self.input is None else parsed_input(self.input, payload)

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
        return seconds_of(self.deadline)  # type: ignore[no-any-return]

    @cached_property
    def waits_for(self) -> list[list[int]]:
        """For each step (by position), the positions of the steps it waits for."""
        where = {s.name: i for i, s in enumerate(self.specs)}
        return [
            ([i - 1] if i else []) if s.after is None else [where[name] for name in s.after]
            for i, s in enumerate(self.specs)
        ]

    def upstream(self, position: int) -> set[int]:
        """The positions of every step the step at ``position`` waits for, directly or not (the
        graph has no cycle: checked when registered)."""
        seen: set[int] = set()
        todo = list(self.waits_for[position])
        while todo:
            at = todo.pop()
            if at not in seen:
                seen.add(at)
                todo.extend(self.waits_for[at])
        return seen

    @cached_property
    def is_linear(self) -> bool:
        """Each step waits for the one before it, none fans out, none is a child run and none has a
        condition: the Scheduler's hot path."""
        return all(s.for_each is None and s.child is None and s.action is not None and s.guard is None
                   for s in self.specs) and self.waits_for == [
            [i - 1] if i else [] for i in range(len(self.steps))
        ]


    def new_run(self, run_id: str, business_key: str, payload: Any, *, reply_to: str | None = None,
                priority: int = 5, **origin: Any) -> NewRun:
        """A run of this workflow as written at submit: its steps (a copy of the graph), version,
        deadline and concurrency key's value; ``origin``: a child's parent, or its schedule."""
        return NewRun(run_id, self.name, business_key, payload, self.new_steps(run_id), reply_to, priority,
                      self.run_version, self.is_linear, deadline=self.deadline_seconds, slot=self.slot_of(payload),
                      max_running=self.max_running if self.concurrency_key else None, **origin)

    def new_steps(self, run_id: str) -> list[NewStep]:
        """The step rows a run of this workflow starts with: a copy of the graph."""
        return [
            NewStep(s.name, s.agent, s.action_name, float(s.timeout), s.max_failures, step_key(run_id, s.name),
                    undo=None if s.compensate is None else action_name(s.compensate), waits_for=waits,
                    for_each=s.for_each, max_parallel=s.max_parallel if s.for_each else None, child=s.child,
                    sleep=None if s.sleep is None else float(s.sleep), sleep_until=s.sleep_until,
                    event=s.event, on_timeout=s.on_timeout if s.event is not None else None,
                    escalate=None if s.on_exhausted is None else s.on_exhausted.as_stored(),
                    condition=None if s.guard is None else s.guard.stored,
                    poll=None if s.poll is None else s.poll.as_stored())
            for s, waits in zip(self.specs, self.waits_for, strict=True)
        ]

    @cached_property
    def run_version(self) -> str:
        """The version each run records: ``version``, or else the first 12 hex digits of a hash of
        the step graph (names, actions, undo, budgets, what each step waits for, fan-out,
        conditions — a function's source too —, polling)."""
        if self.version is not None:
            return self.version
        graph = [
            [s.name, None if s.action is None else action_name(s.action),
             None if s.compensate is None else action_name(s.compensate),
             float(s.timeout), s.max_failures, waits, s.for_each, s.max_parallel if s.for_each else None, s.child,
             None if s.sleep is None else float(s.sleep), s.sleep_until,
             *([s.event, s.on_timeout] if s.event is not None else []),
             *([s.on_exhausted.as_stored()] if s.on_exhausted is not None else []),
             *([s.guard.fingerprint()] if s.guard is not None else []),
             *([s.poll.as_stored()] if s.poll is not None else [])]
            for s, waits in zip(self.specs, self.waits_for, strict=True)
        ]
        return hashlib.sha256(json.dumps(graph, separators=(",", ":")).encode()).hexdigest()[:12]
