"""What an agent action is and what it receives.

An action is a plain function of an :class:`AgentCall` returning a JSON result; ``@agent.action``
makes it an :class:`AgentAction`, generic over that result, so a type checker follows what the
action returns. An undo is declared with ``@agent.undo``: its function receives an
:class:`UndoCall`, whose ``undoes`` (the step it undoes, :class:`Undone`) is always there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

R = TypeVar("R")


class Named(Protocol):
    """Anything with a name: an action's agent, a step."""

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class Undone:
    """The step an undo undoes: its name (``ship[2]`` for a branch) and the idempotency key its
    effect was applied under — what the remote service undoes by."""

    step: str
    idempotency_key: str


@dataclass
class AgentCall:
    """What an action receives: the step's identity, its input and the time left."""

    run_id: str
    business_key: str
    workflow: str
    step: str
    position: int
    #: the attempt: the fencing token, raised each time the step is dispatched again
    attempt: int
    #: stable across every attempt: the remote service deduplicates on it
    idempotency_key: str
    payload: Any
    #: the earlier steps' results, by step name
    results: dict[str, Any]
    budget: float
    #: On an undo: the step it undoes (see :class:`UndoCall`).
    undoes: Undone | None = None
    #: On a branch of a ``for_each`` step: its element of the list, and its index there.
    item: Any = None
    index: int | None = None
    #: A polling step (``poll=Poll(...)``): how many times its action has answered "not yet"
    #: (:class:`~sas_app.errors.NotYet`) before this call: 0 on the first.
    poll: int = 0
    #: This attempt's try in this worker: 1, then 2, 3… each time the agent retries a transient
    #: fault in-process (``attempt`` stays the same: it is the fencing token of the whole attempt).
    try_number: int = 1
    #: The clock the budget is measured on: this process's, or a test's injected one.
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    started: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.started = self.clock()  # when this worker received the step

    @classmethod
    def from_message(cls, message: dict[str, Any], db_now: float | None = None,
                     clock: Callable[[], float] = time.monotonic) -> AgentCall:
        """Parse a step's message (an :class:`UndoCall` for an undo's); raises ``KeyError``,
        ``TypeError`` or ``ValueError`` if it is malformed. With ``db_now`` (the database's clock,
        see :meth:`Store.db_clock`) the budget is what is left before the step's complete-by, which
        may be less than its timeout (or nothing, for a message that waited in the queue past it);
        without, it runs from receipt."""
        undoes = message.get("undoes")
        kind = cls if undoes is None else UndoCall
        call = kind(
            run_id=str(message["run_id"]),
            business_key=str(message["business_key"]),
            workflow=str(message["workflow"]),
            step=str(message["step"]),
            position=int(message["position"]),
            attempt=int(message["attempt"]),
            idempotency_key=str(message["idempotency_key"]),
            payload=message["payload"],
            results=dict(message.get("results") or {}),
            budget=float(message["budget"]),
            undoes=None if undoes is None else Undone(str(undoes["step"]), str(undoes["idempotency_key"])),
            item=message.get("item"),
            index=None if message.get("index") is None else int(message["index"]),
            poll=int(message.get("poll") or 0),
            clock=clock,
        )
        if call.attempt < 1 or call.budget <= 0 or call.position < 0:
            raise ValueError(f"attempt {call.attempt}, budget {call.budget} and position {call.position} "
                             "must be positive")
        complete_by = message.get("complete_by")
        if db_now is not None and complete_by is not None:
            call.budget = min(call.budget, float(complete_by) - db_now)
        return call

    def result_of(self, step: Named | str) -> Any:
        """The result of an earlier step this one waits for (the step object, or its name); a
        ``KeyError`` naming the step and those whose results are here when it is not one of them."""
        name = step if isinstance(step, str) else step.name
        if name not in self.results:
            raise KeyError(f"step {self.step!r} has no result of {name!r}: it has those of "
                           f"{sorted(self.results) or 'no step'}")
        return self.results[name]

    def result_of_any(self, *steps: Named | str) -> Any:
        """The result of the first of ``steps`` that has one: at a join after a choice, the
        branch that was taken (the others were skipped). A ``KeyError`` when none has."""
        for step in steps:
            name = step if isinstance(step, str) else step.name
            if name in self.results:
                return self.results[name]
        names = [s if isinstance(s, str) else s.name for s in steps]
        raise KeyError(f"step {self.step!r}: none of {names} has a result (all skipped?); it has those of "
                       f"{sorted(self.results) or 'no step'}")

    def remaining(self) -> float:
        """Seconds left before complete-by (measured from when this worker received the step)."""
        return self.budget - (self.clock() - self.started)

    def headers(self) -> dict[str, str]:
        """The headers a remote service deduplicates and fences on."""
        return {"Idempotency-Key": self.idempotency_key, "X-Fencing-Token": str(self.attempt)}


class UndoCall(AgentCall):
    """What an undo action receives: an :class:`AgentCall` whose ``undoes`` is always there."""

    undoes: Undone


@dataclass
class ActionName:
    """What names an action: its agent and its own name."""

    agent: Named
    name: str

    @property
    def qualname(self) -> str:
        """``<agent>.<action>``: how the store and the task names name it."""
        return f"{self.agent.name}.{self.name}"


@dataclass
class AgentAction(ActionName, Generic[R]):
    """An action of an agent (``@agent.action``): called with an :class:`AgentCall`, it returns
    ``R``. A step names it as its ``action``."""

    fn: Callable[[AgentCall], R]

    def __call__(self, call: AgentCall) -> R:
        return self.fn(call)


@dataclass
class UndoAction(ActionName, Generic[R]):
    """An undo of an agent (``@agent.undo``): called with an :class:`UndoCall`, it returns ``R``.
    A step names it as its ``compensate``."""

    fn: Callable[[UndoCall], R]

    def __call__(self, call: UndoCall) -> R:
        if not isinstance(call, UndoCall):  # a step's message sent to an undo's task
            raise TypeError(f"the undo {self.qualname} was sent a step's message, not an undo's")
        return self.fn(call)
