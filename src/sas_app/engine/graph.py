"""A run's step graph as the store holds it: which steps may start now, where a ``for_each``
step's list is, and what each step's agent is told of the steps before it.

Pure functions over a run's step rows (read in the transaction that holds the run's lock); the
Scheduler acts on what they say. A workflow step (not an undo, not a branch) may start once every
step it waits for has completed; a ``for_each`` step, once started, has branch rows of its own
and completes when all of them have, with the list of their results in order. A skipped step
counts as settled for the steps that wait for it (:mod:`sas_app.engine.choices`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from sas_app.states import SETTLED_STEP_STATES, StepState
from sas_app.store import RunRow, StepRow

_WAITING = (StepState.NOT_STARTED, StepState.PENDING)


@dataclass(frozen=True)
class Graph:
    """One run's steps, by position."""

    steps: Sequence[StepRow]

    @property
    def workflow_steps(self) -> list[StepRow]:
        """The workflow's own steps (not its branches, not its undos), in position order."""
        return [s for s in self.steps if not s.is_undo and not s.is_branch]

    @cached_property
    def _by_position(self) -> dict[int, StepRow]:
        return {s.position: s for s in self.steps}

    def at(self, position: int) -> StepRow:
        return self._by_position[position]

    def done(self) -> bool:
        """Every workflow step has completed or was skipped."""
        return all(s.state in SETTLED_STEP_STATES for s in self.workflow_steps)

    def ready(self) -> list[StepRow]:
        """Workflow steps waiting to start whose dependencies have all completed or were skipped
        (:func:`sas_app.engine.choices.decide` says which of them are taken)."""
        return [
            s for s in self.workflow_steps
            if s.state in _WAITING and all(self.at(d).state in SETTLED_STEP_STATES for d in s.deps)
        ]

    def fanning_out(self) -> list[StepRow]:
        """``for_each`` steps whose branches are under way."""
        return [s for s in self.workflow_steps if s.for_each is not None and s.state == StepState.RUNNING]

    def branches(self, parent: StepRow) -> list[StepRow]:
        """The branches of ``parent``, by index."""
        return sorted((s for s in self.steps if s.branch_of == parent.position), key=lambda s: s.branch or 0)

    def next_free(self) -> int:
        """The first position no row of the run holds (new branches and undos go from there)."""
        return max((s.position for s in self.steps), default=-1) + 1

    def outline(self) -> list[tuple[StepRow, bool]]:
        """Every row for display, ``(step, is_branch)``: each workflow step followed by its
        branches, then the undos in the order they run."""
        rows: list[tuple[StepRow, bool]] = []
        for step in self.workflow_steps:
            rows.append((step, False))
            rows += [(b, True) for b in self.branches(step)]
        return rows + [(s, False) for s in self.steps if s.is_undo]

    def waits_for_names(self, step: StepRow) -> list[str]:
        """The names of the steps ``step`` waits for."""
        return [self.at(d).name for d in step.deps]

    def results(self) -> dict[str, Any]:
        """The results of the workflow steps that completed (even if since undone), by name: what
        the next agent, or an undo, is told."""
        return {s.name: s.result for s in self.workflow_steps if s.result is not None}


def step_input(run: RunRow, step: StepRow) -> Any:
    """What a step works from: an operator's edited input, else the run's payload."""
    return run.payload if step.input is None else step.input


def to_start(branches: Sequence[StepRow], max_parallel: int) -> list[StepRow]:
    """The branches to start now: waiting ones, in index order, while fewer than ``max_parallel``
    run (a branch waiting for a back-off holds no slot)."""
    running = sum(1 for b in branches if b.state == StepState.RUNNING)
    waiting = [b for b in branches if b.state in _WAITING]
    return waiting[:max(max_parallel - running, 0)]


def _look_up(source: str, payload: Any, results: dict[str, Any]) -> tuple[Any, str] | str:
    """The value at ``source`` — a payload key (``items``) or a key of an earlier step's result
    (``reserve_stock.items``) — and where it was, or the reason it is not there."""
    step, _, key = source.rpartition(".")
    where = f"the result of step {step!r}" if step else "the payload"
    container = results.get(step) if step else payload
    if not isinstance(container, dict) or key not in container:
        return f"{where} has no key {key!r}"
    return container[key], f"{where}'s {key!r}"


def wake_time(step: StepRow, payload: Any, results: dict[str, Any], now: float, longest: float) -> float | str:
    """When a sleep that starts ``now`` wakes (epoch seconds), or why it cannot: its ``until``
    missing or not a time, or further away than ``longest``."""
    if step.sleep is not None:
        return now + step.sleep
    source = step.sleep_until or ""
    found = _look_up(source, payload, results)
    if isinstance(found, str):
        return f"until {source!r}: {found}"
    value, _ = found
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return f"until {source!r}: {value!r} is not an ISO 8601 time or epoch seconds"
        wake = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        wake = float(value)
    else:
        return f"until {source!r}: {value!r} is not an ISO 8601 time or epoch seconds"
    if wake - now > longest:
        return f"until {source!r}: {value!r} is more than {longest:g} s away (SAS_MAX_SLEEP)"
    return wake


def fan_out_list(source: str, payload: Any, results: dict[str, Any], bound: int) -> list[Any] | str:
    """The list a ``for_each`` step fans out over (``items``: a payload key; ``step.key``: a key
    of an earlier step's result), or the reason it cannot: missing, not a list, over ``bound``."""
    found = _look_up(source, payload, results)
    if isinstance(found, str):
        return f"for_each {source!r}: {found}"
    value, where = found
    if not isinstance(value, list):
        return f"for_each {source!r}: {where} is a {type(value).__name__}, not a list"
    if len(value) > bound:
        return f"for_each {source!r}: {len(value)} elements, over the bound of {bound} branches (SAS_MAX_BRANCHES)"
    return value
