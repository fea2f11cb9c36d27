"""Mistakes a type checker must refuse in user code: each line marked ``# refused`` is an error
under ``mypy --strict`` (tests/unit/test_public_api.py checks that exactly these are). Never run."""

from __future__ import annotations

from sas_app import AgentCall, ChildRun, SasApp, Sleep, Step, UndoCall, WaitFor

sas = SasApp()
svc = sas.agent("svc")


@svc.action
def work(call: AgentCall) -> dict[str, str]:
    return {}


@svc.undo
def undo(call: UndoCall) -> dict[str, str]:
    return {"undid": call.undoes["idempotency_key"]}  # refused: undoes is a record, not a dict


Step("a", work, child="kid")  # refused: a child run is a ChildRun
ChildRun("c", "kid", timeout=5)  # refused: a child run has no timeout of its own
Sleep("nap", 5, event="approval")  # refused: a sleep waits for no event
WaitFor("w", "approval", timeout=60, on_timeout="retry")  # refused: not an OnTimeout
Step("b", work, when=lambda step: step.result)  # refused: a StepContext has results, not result
Step("b", work, when=5)  # refused: a condition is a key or a function
Step("c", work, poll=60)  # refused: a poll is a Poll(every, max_wait)
Step("d", work, compensate=work)  # refused: an action is not its own undo
Step("e", undo)  # refused: an undo is no step's action
sas.agent("shop", retry_intial=0.5)  # refused: a misspelled option
sas.workflow("w", [Step("f", work)], deadlin=60)  # refused: a misspelled option
undo(AgentCall("r", "k", "w", "s", 0, 1, "r:s", {}, {}, 5.0))  # refused: an undo is called with an UndoCall
