"""Which of the steps that may start now are taken and which are skipped: a step whose every
dependency was skipped is skipped too; a step with a condition (``when=`` / ``unless=``) runs only
if it holds. Decided once per step, when it is first due — a condition is not asked again once its
step has started (a sleep or a wait goes on waiting), only after an operator resubmits the step.

Pure, but for the conditions written as functions, which are the deployed code's (found by the
run's workflow and the step's name, as an action is). The planner makes the transitions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sas_app.definitions.conditions import Guard, StepContext
from sas_app.engine.graph import Graph, step_input
from sas_app.errors import one_line
from sas_app.states import StepState
from sas_app.store import RunRow, StepRow

#: a step's condition as the deployed code has it, or why it is not there
GuardOf = Callable[[RunRow, StepRow], "Guard | str"]


@dataclass
class Decided:
    """The steps taken (to start), those skipped with the reason, and a condition that could not
    be decided (it raised, or its code is gone) with the reason."""

    taken: list[StepRow] = field(default_factory=list)
    skipped: list[tuple[StepRow, str]] = field(default_factory=list)
    failed: tuple[StepRow, str] | None = None


def undecided(step: StepRow) -> bool:
    """``step`` has not been decided yet: not started, or resubmitted by an operator before it ran."""
    return step.state == StepState.NOT_STARTED or (
        step.state == StepState.PENDING and step.attempt == 0 and step.not_before is None)


def decide(run: RunRow, graph: Graph, ready: Sequence[StepRow], results: dict[str, Any],
           guard_of: GuardOf) -> Decided:
    """Split ``ready`` (steps whose dependencies have all completed or been skipped) into taken
    and skipped. Every condition is asked before anything is written, so one that raises leaves
    the others undecided."""
    decided = Decided()
    for step in ready:
        if not undecided(step):
            decided.taken.append(step)
            continue
        deps = step.deps
        if deps and all(graph.at(d).state == StepState.SKIPPED for d in deps):
            names = ", ".join(graph.waits_for_names(step))
            decided.skipped.append((step, f"every step it waits for was skipped ({names})"))
            continue
        if step.condition is None:
            decided.taken.append(step)
            continue
        guard = Guard.parse(step.condition)
        if guard.path is None:
            found = guard_of(run, step)
            if isinstance(found, str):
                decided.failed = (step, found)
                return decided
            guard = found
        context = StepContext(run.id, run.business_key, step.name, step_input(run, step), results)
        try:
            holds = guard.holds(context)
        except Exception as exc:
            decided.failed = (step, f"step {step.name!r}: its condition `{step.condition}` raised {one_line(exc)}")
            return decided
        if holds:
            decided.taken.append(step)
        else:
            decided.skipped.append((step, f"`{step.condition}` did not hold"))
    return decided
