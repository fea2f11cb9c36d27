"""The steps a workflow is made of: one class per kind, each with only its own fields.

- :class:`Step` runs an agent action (``@agent.action``), with its complete-by budget, failure
  threshold, optional undo (``@agent.undo``), fan-out and escalation;
- :class:`ChildRun` starts another workflow as a child run and waits for it;
- :class:`Sleep` waits in the store for a time; :class:`WaitFor` waits for a signal.

Any of them may be conditional: ``when=`` (or ``unless=``) a key or a function of the payload and
earlier results (:mod:`sas_app.definitions.conditions`); a step not taken ends ``skipped``.

Steps refer to each other by object — ``after=[reserve, fraud]``, ``for_each=reserve.output("items")``,
``call.result_of(reserve)`` — or, where a name reads as well, by name (``after=["reserve_stock"]``,
``for_each="items"`` for a payload key). Durations are seconds or a ``timedelta``. Each kind becomes a
:class:`StepSpec`, the one shape the engine reads (every field, most unused by any one kind); a
:class:`~sas_app.definitions.workflow.Workflow` holds its steps so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol

from sas_app.definitions.actions import AgentAction, UndoAction
from sas_app.definitions.conditions import Condition, Guard
from sas_app.errors import WorkflowDefinitionError
from sas_app.states import Word

#: a duration: seconds, or a timedelta
Seconds = float | timedelta


class ActionRef(Protocol):
    """Anything that names an agent action: an AgentAction or UndoAction (or its ``"agent.action"``)."""

    @property
    def qualname(self) -> str: ...


class WorkflowRef(Protocol):
    """A :class:`~sas_app.definitions.workflow.Workflow`, as a child run names it."""

    @property
    def name(self) -> str: ...

    @property
    def specs(self) -> Sequence[StepSpec]: ...


def action_name(ref: str | ActionRef) -> str:
    return ref if isinstance(ref, str) else ref.qualname


def seconds_of(value: Any) -> Any:
    """A ``timedelta`` as seconds; anything else as it is (checked when registered)."""
    return value.total_seconds() if isinstance(value, timedelta) else value


class OnTimeout(Word):
    """What a :class:`WaitFor`'s timeout does."""

    COMPENSATE = "compensate"  # undo the run
    ERROR = "error"  # leave the run in error for an operator
    CONTINUE = "continue"  # go on; the wait's result is {"timed_out": true}


class Then(Word):
    """What an :class:`Escalate` does once its retries have failed too."""

    COMPENSATE = "compensate"  # undo the run
    ERROR = "error"  # leave the run in error for an operator


@dataclass(frozen=True)
class Escalate:
    """What a step does at its failure threshold instead of failing at once — the pattern's
    Supervisor "waiting for an extended period before notifying the Scheduler that it should retry
    the step, in the expectation that the fault will be resolved": wait ``wait``, then make
    ``retries`` more attempts; if those fail too, ``then``. An alert on each rung."""

    wait: Seconds
    retries: int = 1
    then: Then | Literal["compensate", "error"] = Then.COMPENSATE

    def as_stored(self) -> dict[str, Any]:
        return {"wait": float(seconds_of(self.wait)), "retries": self.retries, "then": str(self.then)}


@dataclass(frozen=True)
class Poll:
    """A step that starts or checks a long job on its remote service and answers "not yet"
    (``raise NotYet(after=...)``) until it is done: between calls it waits in the store, holding
    no message and no worker, and its action is called again ``every`` seconds (or when the
    ``NotYet`` says), each call with the step's short ``timeout`` as its complete-by, the same
    idempotency key and ``call.poll`` counting the answers so far. Not done ``max_wait`` after
    its first "not yet" (one last call is made then), it fails for good: one alert, and the run
    is undone."""

    every: Seconds
    max_wait: Seconds

    def as_stored(self) -> dict[str, float]:
        return {"every": float(seconds_of(self.every)), "max_wait": float(seconds_of(self.max_wait))}


@dataclass(frozen=True)
class Output:
    """A key of an earlier step's result (``reserve.output("items")``): the list a fan-out runs
    over, or the time a sleep wakes at."""

    step: str
    key: str

    def __str__(self) -> str:
        return f"{self.step}.{self.key}"


#: what ``when=`` and ``unless=`` take: a payload key, an earlier step's result key, or a function
When = Output | str | Condition


@dataclass(frozen=True)
class StepDef:
    """What every kind of step has: a name, the steps it waits for (``after``: left out, the
    step before it — the first waits for nothing; ``[]``: it starts with the run; several: it is
    their join), as step objects or their names, and optionally a condition.

    A step starts once each step it waits for has completed or was skipped, and at least one
    completed; a step whose every dependency was skipped is skipped too. With ``when=`` it then
    runs only if its condition holds (``unless=``: only if it does not), else it is skipped, with
    the reason. A skipped step is never undone; a run whose remaining steps are skipped is
    processed."""

    name: str
    after: Sequence[StepDef | str] | None = field(default=None, kw_only=True)
    when: When | None = field(default=None, kw_only=True)
    unless: When | None = field(default=None, kw_only=True)

    def output(self, key: str) -> Output:
        """A key of this step's result, for a later step's ``for_each`` or a sleep's ``until``."""
        return Output(self.name, key)

    def spec(self) -> StepSpec:
        raise NotImplementedError  # pragma: no cover - each kind has its own

    def _after(self) -> list[str] | None:
        if self.after is None:
            return None
        if isinstance(self.after, (str, StepDef)):
            raise WorkflowDefinitionError(f"step {self.name!r}: after= takes a list of steps, got {self.after!r}")
        return [ref.name if isinstance(ref, StepDef) else ref for ref in self.after]

    def _guard(self) -> Guard | None:
        if self.when is not None and self.unless is not None:
            raise WorkflowDefinitionError(f"step {self.name!r}: give when= or unless=, not both")
        test = self.unless if self.when is None else self.when
        if test is None:
            return None
        if isinstance(test, (Output, str)):
            return Guard(unless=self.when is None, path=str(test))
        if not callable(test):
            raise WorkflowDefinitionError(
                f"step {self.name!r}: {'unless' if self.when is None else 'when'}= takes a payload key, an "
                f"earlier step's output (quote.output('express')) or a function of a StepContext, got {test!r}")
        return Guard(unless=self.when is None, fn=test)


@dataclass(frozen=True)
class Step(StepDef):
    """A step that runs an agent action (``@agent.action``, or its ``"agent.action"`` name).

    ``timeout`` is its complete-by budget for each attempt; after ``max_failures`` failed attempts
    it fails for good, with one alert, and the run is undone (each step with a ``compensate`` —
    an ``@agent.undo`` — whose effect may have happened, last first), or goes to ``error`` when
    there is nothing to undo; ``on_exhausted=Escalate(...)`` waits and retries first.

    ``for_each`` runs it once per element of a list — a payload key (``"items"``) or a key of an
    earlier step's result (``reserve.output("items")``) — each branch with its own attempts,
    complete-by and idempotency key (``<run>:<step>:<index>``), at most ``max_parallel`` at once.
    Its result is the list of its branches' results, in order.

    ``poll=Poll(every, max_wait)`` makes it a polling step: its action may answer "not yet"
    (:class:`~sas_app.errors.NotYet`) and is asked again later, as :class:`Poll` says."""

    action: AgentAction[Any] | str
    timeout: Seconds = 30.0
    max_failures: int = 3
    compensate: UndoAction[Any] | str | None = None
    for_each: Output | str | None = None
    max_parallel: int = 10
    on_exhausted: Escalate | None = None
    poll: Poll | None = None

    def spec(self) -> StepSpec:
        return StepSpec(self.name, self.action, seconds_of(self.timeout), self.max_failures, self.compensate,
                        self._after(), None if self.for_each is None else str(self.for_each), self.max_parallel,
                        on_exhausted=self.on_exhausted, guard=self._guard(), poll=self.poll)


@dataclass(frozen=True)
class ChildRun(StepDef):
    """A step that starts ``workflow`` (registered before this one) as a child run, with this run's
    payload, and waits for it: it completes with the child's results when the child is processed
    and fails when it ends otherwise. Cancelling or undoing this run cancels a live child; the
    child is supervised like any run."""

    workflow: WorkflowRef | str

    def spec(self) -> StepSpec:
        child = self.workflow if isinstance(self.workflow, str) else self.workflow.name
        return StepSpec(self.name, after=self._after(), child=child, guard=self._guard())


@dataclass(frozen=True)
class Sleep(StepDef):
    """A step that waits: ``seconds``, or until the time found at ``until`` (a payload key, or an
    earlier step's result key: ``quote.output("valid_until")``; epoch seconds or an ISO 8601
    time). The run waits in the store, holding no message and no worker slot, and the
    Supervisor's sweep wakes it on the database's clock. Its result is ``{"slept_until": <epoch
    seconds>}``."""

    seconds: Seconds | None = None
    until: Output | str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.until is None):
            raise WorkflowDefinitionError(f"sleep {self.name!r} needs seconds or until=, exactly one")

    def spec(self) -> StepSpec:
        return StepSpec(self.name, after=self._after(), sleep=seconds_of(self.seconds),
                        sleep_until=None if self.until is None else str(self.until), guard=self._guard())


@dataclass(frozen=True)
class WaitFor(StepDef):
    """A step that waits for ``event``: ``sas.signal(run_id, event, payload)`` ends it, and the
    signal's payload is its result. A signal sent before the run gets here is kept and consumed
    when it does. After ``timeout`` with none, ``on_timeout`` (:class:`OnTimeout`). Like a sleep,
    it waits in the store, holding no message and no worker slot."""

    event: str
    timeout: Seconds = field(kw_only=True)
    on_timeout: OnTimeout | Literal["compensate", "error", "continue"] = field(default=OnTimeout.COMPENSATE,
                                                                             kw_only=True)

    def spec(self) -> StepSpec:
        return StepSpec(self.name, timeout=seconds_of(self.timeout), after=self._after(), event=self.event,
                        on_timeout=str(self.on_timeout), guard=self._guard())


@dataclass(frozen=True)
class StepSpec:
    """A step as the engine reads it, whatever its kind: every field, most of them unused by any
    one kind (see :class:`Step`, :class:`ChildRun`, :class:`Sleep`, :class:`WaitFor`). Checked when
    its workflow is registered (:mod:`sas_app.definitions.checks`)."""

    name: str
    action: ActionRef | str | None = None
    timeout: float = 30.0
    max_failures: int = 3
    compensate: ActionRef | str | None = None
    after: Sequence[str] | None = None
    for_each: str | None = None
    max_parallel: int = 10
    child: str | None = None
    sleep: float | None = None
    sleep_until: str | None = None
    event: str | None = None
    on_timeout: str = "compensate"
    on_exhausted: Escalate | None = None
    #: its condition (``when=`` / ``unless=``), if it has one
    guard: Guard | None = None
    #: a polling step's interval and bound
    poll: Poll | None = None

    @property
    def agent(self) -> str:
        return "" if self.action is None else action_name(self.action).split(".", 1)[0]

    @property
    def action_name(self) -> str:
        return "" if self.action is None else action_name(self.action).split(".", 1)[1]


def spec_of(step: Any) -> StepSpec:
    """``step`` as the engine reads it; a :class:`WorkflowDefinitionError` for anything that is not a step."""
    if isinstance(step, StepSpec):
        return step
    if isinstance(step, StepDef):
        return step.spec()
    raise WorkflowDefinitionError(f"{step!r} is not a step (Step, ChildRun, Sleep or WaitFor)")
