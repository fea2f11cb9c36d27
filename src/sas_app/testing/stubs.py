"""Agents' actions in a test environment: each runs for real unless stubbed, and every call is
recorded.

A stub answers each call of its action in turn — a value to return, an exception to raise, or one
of :data:`HANG` (the call outlasts its complete-by) and :data:`WORKER_LOST` (the worker running it
dies) — the last answer repeating unless the stub was given a sequence, which must not run out; or
a function of the call gives each answer (one branch of a fan-out failing, say)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sas_app.definitions.actions import AgentCall, UndoCall, Undone
from sas_app.testing.clock import VirtualClock


class _Outcome:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


HANG = _Outcome("HANG")
"""An answer of a stub: the call takes longer than its complete-by (the step is retried when the
Supervisor finds it expired)."""
WORKER_LOST = _Outcome("WORKER_LOST")
"""An answer of a stub: the worker running the call dies (Celery's worker lost: the Scheduler is
told, and counts it as a failure)."""


class WorkerDied(BaseException):
    """Raised through the agent by a :data:`WORKER_LOST` answer: the environment then does what an
    agent worker's main process does when one of its pool processes dies."""


class StubExhausted(AssertionError):
    """A stub given a sequence of answers was called once more than it has answers."""


class _Exhausted(BaseException):
    def __init__(self, error: StubExhausted) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class Call:
    """One call of an action, as the agent made it."""

    action: str
    run_id: str
    business_key: str
    step: str
    #: the attempt: the fencing token sent to the remote service
    attempt: int
    #: the try within the attempt (in-process retries of a transient fault)
    try_number: int
    #: stable across every attempt: what the remote service deduplicates on
    idempotency_key: str
    payload: Any
    results: dict[str, Any]
    item: Any
    #: on an undo, the step it undoes and the idempotency key its effect was applied under
    undoes: Undone | None
    #: the virtual clock when it was called
    at: float
    #: a polling step's "not yet" answers before this call
    poll: int = 0

    @property
    def fencing_token(self) -> int:
        return self.attempt


class Stub:
    """The answers of one stubbed action (see the module's docstring)."""

    def __init__(self, action: str, answers: Sequence[Any], repeat_last: bool,
                 answer_of: Callable[[AgentCall], Any] | None = None) -> None:
        if not answers and answer_of is None:
            raise ValueError(f"a stub of {action} needs at least one answer")
        self.action = action
        self.answers = list(answers)
        self.repeat_last = repeat_last
        self.answer_of = answer_of
        self.used = 0

    def answer(self, call: AgentCall, clock: VirtualClock) -> Any:
        if self.answer_of is not None:
            answer = self.answer_of(call)
        elif self.used >= len(self.answers) and not self.repeat_last:
            raise _Exhausted(StubExhausted(
                f"the stub of {self.action} ran out of answers: call {self.used + 1} (run {call.run_id} step "
                f"{call.step!r} attempt {call.attempt} try {call.try_number}) after the {len(self.answers)} given"))
        else:
            answer = self.answers[min(self.used, len(self.answers) - 1)]
        self.used += 1
        if answer is HANG:
            clock.move_past(clock.now + call.remaining())
            return None
        if answer is WORKER_LOST:
            raise WorkerDied(f"{self.action}: worker lost (stubbed)")
        if isinstance(answer, BaseException):
            raise answer
        return answer


class Recorder:
    """Every call of every action, and the stubs that answer some of them."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self.stubs: dict[str, Stub] = {}

    def wrap(self, qualname: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn`` as the environment runs it: recorded, and answered by its stub when it has one."""

        def call_action(call: AgentCall) -> Any:
            undoes = call.undoes if isinstance(call, UndoCall) else None
            self.calls.append(Call(qualname, call.run_id, call.business_key, call.step, call.attempt,
                                   call.try_number, call.idempotency_key, call.payload, dict(call.results),
                                   call.item, undoes, self.clock.now, call.poll))
            stub = self.stubs.get(qualname)
            return fn(call) if stub is None else stub.answer(call, self.clock)

        call_action.__name__ = getattr(fn, "__name__", qualname)
        return call_action
