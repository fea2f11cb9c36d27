"""Workflow definitions: ordered steps, each with its agent action, complete-by budget, failure
threshold and optional compensating action. Mistakes are caught when a workflow is registered."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .errors import WorkflowDefinitionError

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
class Step:
    """One step of a workflow.

    ``action`` names the agent call that performs it (``"payment.charge"``); ``timeout`` is its
    complete-by budget in seconds for each attempt; after ``max_failures`` failed attempts the step
    fails for good, with one alert, and the run is undone (each step with a ``compensate`` whose
    effect may have happened, last first) — or goes to ``error`` when there is nothing to undo.
    ``compensate`` names the agent call that undoes it.
    """

    name: str
    action: str | ActionRef
    timeout: float = 30.0
    max_failures: int = 3
    compensate: str | ActionRef | None = None

    @property
    def agent(self) -> str:
        return action_name(self.action).split(".", 1)[0]

    @property
    def action_name(self) -> str:
        return action_name(self.action).split(".", 1)[1]


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



def check_workflow(
    workflow: Workflow, known_actions: Iterable[str], *, visibility_timeout: float
) -> None:
    """Raise :class:`WorkflowDefinitionError` naming the first mistake in ``workflow``."""
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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
